#include "templates/template_build.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "common/fd.hpp"
#include "common/file_digest.hpp"
#include "protocol/image_defaults.hpp"
#include "templates/image_delta.hpp"
#include "templates/image_user.hpp"
#include "templates/rooted_tree.hpp"
#include "templates/tool.hpp"

namespace agentvm {
namespace {

using Clock = std::chrono::steady_clock;

// What init and the agent need in any image (guest/init.cpp mounts on them; a shell session
// keeps its FIFOs under /tmp).
struct MountPoint {
    const char* path;
    mode_t mode;
};
constexpr MountPoint mount_points[] = {{"/dev", 0755}, {"/proc", 0555}, {"/sys", 0555}, {"/tmp", 01777},
                                       {"/run", 0755}, {"/root", 0700}};
// Where guest/guest_cmdline and guest/agent_service look for them.
constexpr char init_path[] = "/sbin/agentvm-init";
constexpr char agent_path[] = "/sbin/agentvm-agent";
// An image's user database larger than this is not one a user would have meant.
constexpr size_t max_user_database_bytes = 16 * 1024 * 1024;

// What a host tree is, without reading its files: every entry's path, type, mode, owner,
// size, mtime and symlink target. A file edited in place moves its mtime.
std::string tree_digest(const std::filesystem::path& root)
{
    std::vector<std::string> entries;
    const auto describe = [&](const std::filesystem::path& path) {
        struct stat st {};
        if (::lstat(path.c_str(), &st) != 0)
            throw_errno(fmt::format("reading '{}'", path.string()));
        std::string target;
        if (S_ISLNK(st.st_mode))
            target = std::filesystem::read_symlink(path).string();
        // Lexically: relative() would resolve the tree's symlinks on the host (a Debian tree's
        // /dev/stderr leads to /proc/self/fd/2) and fail on one that leads nowhere here.
        entries.push_back(fmt::format("{}\0{:o}\0{}:{}\0{}\0{}.{}\0{}", path.lexically_relative(root).string(),
                                      st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtim.tv_sec,
                                      st.st_mtim.tv_nsec, target));
    };
    describe(root);
    std::error_code ec;
    if (std::filesystem::is_directory(std::filesystem::symlink_status(root))) {
        for (auto it = std::filesystem::recursive_directory_iterator(root, ec);
             !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
            describe(it->path());
        if (ec)
            throw Error(fmt::format("listing '{}': {}", root.string(), ec.message()));
    }
    std::sort(entries.begin(), entries.end());
    std::string all;
    for (const std::string& entry : entries)
        all += entry + '\n';
    return sha256_hex(all);
}

std::string source_key(const TemplateSource& source)
{
    switch (source.kind) {
    case SourceKind::oci_archive:
    case SourceKind::docker_archive:
        return sha256_hex(source.text() + "\n" + content_digest_of(source.path.string()));
    case SourceKind::oci_layout:
        return sha256_hex("oci\n" + source.tag + "\n" + content_digest_of((source.path / "index.json").string()));
    case SourceKind::dir:
        return sha256_hex("dir\n" + tree_digest(source.path));
    case SourceKind::containerfile:
        return sha256_hex("containerfile\n" + content_digest_of(source.path.string()) + "\n"
                          + tree_digest(source.context));
    case SourceKind::packages:
        return sha256_hex(source.text());
    }
    return "";
}

double seconds_since(Clock::time_point start)
{
    return std::chrono::duration<double>(Clock::now() - start).count();
}

uint64_t allocated_bytes(const std::filesystem::path& path)
{
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
        throw_errno(fmt::format("stat '{}'", path.string()));
    return static_cast<uint64_t>(st.st_blocks) * 512;
}

// An ext4 mounted for the build; unmounted when it goes (the namespace would drop it anyway).
class LoopMount {
public:
    LoopMount(const std::filesystem::path& image, const std::filesystem::path& at) : at_(at)
    {
        std::filesystem::create_directories(at_);
        run_tool({"mount", "-t", "ext4", "-o", "loop,nodev,nosuid,noexec", image.string(), at_.string()},
                 {.what = "mounting the image being built"});
        mounted_ = true;
    }
    ~LoopMount()
    {
        if (mounted_ && ::umount2(at_.c_str(), MNT_DETACH) != 0)
            spdlog::warn("unmounting '{}': {}", at_.string(), std::strerror(errno));
    }
    LoopMount(const LoopMount&) = delete;
    LoopMount& operator=(const LoopMount&) = delete;
    // Unmounts now, so the image is complete on disk. Throws Error.
    void unmount()
    {
        mounted_ = false;
        run_tool({"umount", at_.string()}, {.what = "unmounting the image being built"});
    }
    const std::filesystem::path& path() const { return at_; }
    // Whether the mounted filesystem is (nearly) full: what a failed unpack into it means.
    bool full() const
    {
        struct statvfs fs {};
        return ::statvfs(at_.c_str(), &fs) == 0 && fs.f_bavail * 100 < fs.f_blocks;
    }

private:
    std::filesystem::path at_;
    bool mounted_ = false;
};

void make_empty_ext4(const std::filesystem::path& image, uint64_t mib)
{
    {
        Fd fd(::open(image.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
        if (!fd || ::ftruncate(fd.get(), static_cast<off_t>(mib << 20)) != 0)
            throw_errno(fmt::format("creating the {} MiB image '{}'", mib, image.string()));
    }
    // As rootfs/build.sh makes the default guest's (its comments say why): no journal, no
    // reserved blocks, inode tables zeroed now rather than by the guest at every boot.
    run_tool({"mkfs.ext4", "-q", "-F", "-L", "root", "-E", "root_owner=0:0,lazy_itable_init=0", "-O", "^has_journal",
              "-m", "0", "-b", "4096", image.string()},
             {.what = "making the image's filesystem (mkfs.ext4)"});
}

// Copies `from` to `to`, sharing its blocks where the filesystem can (reflink), and keeping
// its holes where it cannot.
void clone_image(const std::filesystem::path& from, const std::filesystem::path& to)
{
    run_tool({"cp", "--reflink=auto", "--sparse=always", from.string(), to.string()},
             {.what = "copying the base image"});
}

std::string check_architecture(const ImageConfig& config)
{
    if (config.architecture.empty()) {
        spdlog::warn("the image's config names no architecture; assuming amd64");
        return "amd64";
    }
    if (config.architecture != "amd64")
        throw Error(fmt::format("the image is built for {}, and agentvm guests are x86-64 (amd64): build or pull "
                                "the image for linux/amd64",
                                config.architecture));
    return config.architecture;
}

nlohmann::json config_json(const ImageConfig& config)
{
    return {{"architecture", config.architecture}, {"env", config.env}, {"workdir", config.workdir}, {"user", config.user}};
}

// Unpacks the source into a fresh image of the template's disk size at `base` and returns the
// image's config (what its Env/WorkingDir/User say; empty for a directory).
nlohmann::json make_base(const TemplateStore& store, const TemplateRecipe& recipe, const std::filesystem::path& work,
                         const std::filesystem::path& base)
{
    ImageConfig config;
    const auto layout = work / "oci";
    const bool is_image = recipe.source.kind != SourceKind::dir && recipe.source.kind != SourceKind::packages;
    const auto tree = work / "tree";
    if (recipe.source.kind == SourceKind::packages) {
        const auto step = Clock::now();
        spdlog::info("installing Debian with {} (debootstrap: minutes)", recipe.source.text());
        debootstrap_tree(recipe.source, tree, store.debs());
        spdlog::info("installed in {:.1f} s", seconds_since(step));
    }
    if (is_image) {
        auto step = Clock::now();
        spdlog::info("reading {}", recipe.source.text());
        import_image(recipe.source, layout, recipe.name);
        config = read_image_config(layout);
        config.architecture = check_architecture(config);
        spdlog::info("image {} read in {:.1f} s", image_digest(layout), seconds_since(step));
    }
    make_empty_ext4(base, recipe.disk_mib);
    LoopMount mount(base, work / "mnt");
    const auto step = Clock::now();
    try {
        if (is_image)
            unpack_image(layout, mount.path());
        else
            run_tool({"cp", "-a", "--reflink=auto",
                      ((recipe.source.kind == SourceKind::dir ? recipe.source.path : tree) / ".").string(),
                      mount.path().string()},
                     {.what = fmt::format("copying {}", recipe.source.text())});
    } catch (const Error& e) {
        // The tool may have removed its partial file before saying why: its message tells too.
        if (mount.full() || std::string_view(e.what()).find(std::strerror(ENOSPC)) != std::string_view::npos
            || std::string_view(e.what()).find("no space left on device") != std::string_view::npos)
            throw Error(fmt::format("{}'s files do not fit in the template's {} MiB disk: give a larger --disk-size "
                                    "({})",
                                    recipe.source.text(), recipe.disk_mib, e.what()));
        throw;
    }
    spdlog::info("unpacked into a {} MiB disk in {:.1f} s", recipe.disk_mib, seconds_since(step));
    mount.unmount();
    std::error_code ec;
    std::filesystem::remove_all(layout, ec);
    std::filesystem::remove_all(tree, ec);
    return config_json(config);
}

// KEY=VALUE entries, the later's value winning for a key, in first-seen order.
std::vector<std::string> merged_env(const std::vector<std::string>& image, const std::vector<std::string>& given)
{
    std::vector<std::string> order;
    std::map<std::string, std::string> values;
    for (const auto* list : {&image, &given}) {
        for (const std::string& entry : *list) {
            const size_t equals = entry.find('=');
            if (equals == std::string::npos || equals == 0)
                continue;  // an image's malformed entry: the guest would skip it too
            const std::string key = entry.substr(0, equals);
            if (!values.contains(key))
                order.push_back(key);
            values[key] = entry.substr(equals + 1);
        }
    }
    std::vector<std::string> merged;
    for (const std::string& key : order)
        merged.push_back(key + "=" + values[key]);
    return merged;
}

// What every tool call of the template gets (protocol/image_defaults.hpp).
struct ImageDefaults {
    std::vector<std::string> env;
    std::string workdir;
    std::string user;  // as the image's User or --user said it; "" for root
    std::optional<ResolvedUser> run_as;
};

// The image's Env, WorkingDir and User with --env, --workdir and --user over them. A user
// other than root also gets its HOME, unless set, and its home (or "/") as the working
// directory, unless set: /root, the default, is not theirs.
ImageDefaults image_defaults(const TemplateRecipe& recipe, const nlohmann::json& config, const RootedTree& tree)
{
    ImageDefaults defaults;
    defaults.env = merged_env(config.value("env", std::vector<std::string>{}), recipe.env);
    defaults.workdir = recipe.workdir.empty() ? config.value("workdir", "") : recipe.workdir;
    defaults.user = recipe.user.empty() ? config.value("user", "") : recipe.user;
    if (defaults.user.empty())
        return defaults;
    const ResolvedUser user =
        resolve_image_user(defaults.user, tree.read_file("/etc/passwd", max_user_database_bytes).value_or(""),
                           tree.read_file("/etc/group", max_user_database_bytes).value_or(""));
    if (user.is_root())
        return defaults;
    defaults.run_as = user;
    const bool has_home = std::any_of(defaults.env.begin(), defaults.env.end(),
                                      [](const std::string& entry) { return entry.starts_with("HOME="); });
    if (!has_home)
        defaults.env.push_back("HOME=" + user.home);
    if (defaults.workdir.empty())
        defaults.workdir = tree.is_directory(user.home) ? user.home : "/";
    return defaults;
}

// Our part of the template's image: init, agent, mount points, defaults, the user's --copy.
// Returns the defaults written.
ImageDefaults finish_image(const TemplateRecipe& recipe, const GuestBinaries& guest,
                           const std::filesystem::path& mounted, const nlohmann::json& config)
{
    const RootedTree tree(mounted);
    for (const MountPoint& point : mount_points)
        tree.make_dirs(point.path, point.mode);
    // The kernel opens the console for init before init mounts devtmpfs.
    tree.make_char_device("/dev/console", 0600, 5, 1);
    tree.make_char_device("/dev/null", 0666, 1, 3);
    tree.copy_file(guest.init, init_path, 0755);
    tree.copy_file(guest.agent, agent_path, 0755);
    for (const auto& [from, to] : recipe.copies)
        tree.copy_in(from, to);
    // After the copies, which may bring the user database.
    const ImageDefaults defaults = image_defaults(recipe, config, tree);
    std::string env_file;
    for (const std::string& entry : defaults.env) {
        env_file += entry;
        env_file += '\0';
    }
    tree.write_file(image_env_path, env_file, 0644);
    if (!defaults.workdir.empty()) {
        tree.make_dirs(defaults.workdir, 0755);
        tree.write_file(image_workdir_path, defaults.workdir + "\n", 0644);
    }
    if (defaults.run_as)
        tree.write_file(image_user_path, format_image_user(defaults.run_as->ids), 0644);
    return defaults;
}

} // namespace

std::pair<std::filesystem::path, std::string> parse_copy(const std::string& spec)
{
    const size_t colon = spec.find(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == spec.size())
        throw Error(fmt::format("--copy '{}': expected HOST_PATH:IMAGE_PATH", spec));
    const std::string to = spec.substr(colon + 1);
    if (to.front() != '/')
        throw Error(fmt::format("--copy '{}': the image path must be absolute", spec));
    const std::filesystem::path from = std::filesystem::absolute(spec.substr(0, colon));
    std::error_code ec;
    if (!std::filesystem::exists(std::filesystem::symlink_status(from, ec)))
        throw Error(fmt::format("--copy '{}': '{}' does not exist", spec, from.string()));
    return {from, to};
}

void check_env_entry(const std::string& entry)
{
    const size_t equals = entry.find('=');
    if (equals == std::string::npos || equals == 0)
        throw Error(fmt::format("--env '{}': expected KEY=VALUE", entry));
    if (entry.find('\0') != std::string::npos)
        throw Error("--env: a NUL byte cannot be in the environment");
}

void enter_private_mount_namespace()
{
    if (::unshare(CLONE_NEWNS) != 0)
        throw_errno("unshare(CLONE_NEWNS) for the build's mounts (needs root)");
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
        throw_errno("making the build's mounts private");
}

BuildResult build_template_image(const TemplateStore& store, const TemplateRecipe& recipe, const GuestBinaries& guest)
{
    const auto start = Clock::now();
    require_tools(tools_for(recipe.source));
    require_tools({{"mkfs.ext4", "e2fsprogs"}, {"mount", "mount"}, {"strip", "binutils"}});

    const std::string source = source_key(recipe.source);
    nlohmann::json copies = nlohmann::json::array();
    for (const auto& [from, to] : recipe.copies)
        copies.push_back({{"from", from.string()}, {"to", to}, {"digest", tree_digest(from)}});
    const std::string base_key = sha256_hex(fmt::format("{}\n{}\n{}", template_format, source, recipe.disk_mib));
    const nlohmann::json inputs{{"format", template_format},
                                {"base", base_key},
                                {"copies", copies},
                                {"env", recipe.env},
                                {"workdir", recipe.workdir},
                                {"user", recipe.user},
                                {"init", content_digest_of(guest.init.string())},
                                {"agent", content_digest_of(guest.agent.string())}};
    const std::string image_key = sha256_hex(inputs.dump());

    std::optional<nlohmann::json> existing = store.read(recipe.name);
    std::error_code ec;
    if (existing && existing->value("image_key", "") == image_key
        && std::filesystem::exists(store.layer_of(recipe.name), ec)
        && std::filesystem::exists(store.layer_ranges_of(recipe.name), ec)
        && std::filesystem::exists(store.base_image(base_key), ec)) {
        spdlog::info("template '{}': its image is current", recipe.name);
        nlohmann::json manifest = *existing;
        // What only the bake uses may have changed; the bake's key says whether it must rerun.
        manifest["run"] = recipe.run;
        manifest["warm_up"] = recipe.warm_up;
        manifest["cpus"] = recipe.cpus;
        manifest["mem_mib"] = recipe.mem_mib;
        store.write(recipe.name, manifest);
        return {manifest, false};
    }

    const auto work = store.work() / fmt::format("{}.{}", recipe.name, ::getpid());
    std::filesystem::create_directories(work);
    struct RemoveWork {
        std::filesystem::path dir;
        ~RemoveWork()
        {
            std::error_code ignored;
            std::filesystem::remove_all(dir, ignored);
        }
    } remove_work{work};

    const auto base = store.base_image(base_key);
    const auto base_config = store.bases() / (base_key + ".json");
    nlohmann::json config;
    if (std::filesystem::exists(base, ec) && std::filesystem::exists(base_config, ec)) {
        spdlog::info("reusing the unpacked {} ({})", recipe.source.text(), base.string());
        std::ifstream in(base_config);
        config = nlohmann::json::parse(in, nullptr, false);
        if (!config.is_object())
            throw Error(fmt::format("'{}' is not what a build wrote: remove it", base_config.string()));
    } else {
        config = make_base(store, recipe, work, work / "base.ext4");
        {
            std::ofstream out(work / "base.json");
            out << config.dump() << '\n';
        }
        std::filesystem::rename(work / "base.ext4", base);
        std::filesystem::rename(work / "base.json", base_config);
    }

    auto step = Clock::now();
    // Debug info is of no use in the guest (no debugger there); the build tree keeps it.
    const GuestBinaries stripped{work / "agentvm-init", work / "agentvm-agent"};
    run_tool({"strip", "--strip-debug", "-o", stripped.init.string(), guest.init.string()},
             {.what = "stripping agentvm-init"});
    run_tool({"strip", "--strip-debug", "-o", stripped.agent.string(), guest.agent.string()},
             {.what = "stripping agentvm-agent"});
    const auto image = work / "rootfs.ext4";
    clone_image(base, image);
    ImageDefaults defaults;
    {
        LoopMount mount(image, work / "mnt");
        defaults = finish_image(recipe, stripped, mount.path(), config);
        mount.unmount();
    }
    spdlog::info("agentvm's init and agent, defaults and {} --copy written in {:.1f} s", recipe.copies.size(),
                 seconds_since(step));
    step = Clock::now();
    const auto layer = work / "rootfs.layer";
    const ImageDelta delta = write_image_delta(base, image, layer);
    std::filesystem::remove(image);
    spdlog::info("the template's own blocks: {:.1f} MiB in {} ranges over its base, found in {:.1f} s",
                 static_cast<double>(delta.bytes) / 1048576.0, delta.byte_ranges.size(), seconds_since(step));
    nlohmann::json run_as = nullptr;
    if (defaults.run_as) {
        const ImageUser& ids = defaults.run_as->ids;
        run_as = {{"uid", ids.uid}, {"gid", ids.gid}, {"groups", ids.groups}, {"home", defaults.run_as->home}};
        spdlog::info("tool calls run as '{}' (uid {}, gid {})", defaults.user, ids.uid, ids.gid);
    }

    nlohmann::json manifest{{"format", template_format},
                            {"name", recipe.name},
                            {"source", recipe.source.text()},
                            {"source_key", source},
                            {"base_key", base_key},
                            {"image_key", image_key},
                            {"image_config", config},
                            {"env", defaults.env},
                            {"workdir", defaults.workdir},
                            {"user", defaults.user},
                            {"run_as", run_as},
                            {"copies", copies},
                            {"run", recipe.run},
                            {"warm_up", recipe.warm_up},
                            {"cpus", recipe.cpus},
                            {"mem_mib", recipe.mem_mib},
                            {"disk_mib", recipe.disk_mib},
                            {"layer", {{"ranges", delta.byte_ranges.size()}, {"bytes", delta.bytes}}},
                            {"image_bytes", allocated_bytes(layer)},
                            {"built_at", utc_timestamp()},
                            {"snapshot", nullptr}};
    // The old template (its snapshot with it: it was of the old image) goes, the new comes in.
    const auto dir = store.dir_of(recipe.name);
    const auto staged = work / "template";
    std::filesystem::create_directories(staged);
    std::filesystem::rename(layer, staged / "rootfs.layer");
    write_ranges_file(staged / "rootfs.layer.ranges", delta.byte_ranges);
    const auto old = work / "old";
    if (std::filesystem::exists(dir, ec))
        std::filesystem::rename(dir, old);
    std::filesystem::rename(staged, dir);
    store.write(recipe.name, manifest);
    spdlog::info("template '{}': image built in {:.1f} s ({:.1f} MiB on disk)", recipe.name, seconds_since(start),
                 static_cast<double>(manifest["image_bytes"].get<uint64_t>()) / 1048576.0);
    return {manifest, true};
}

} // namespace agentvm
