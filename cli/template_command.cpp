#include <CLI/CLI.hpp>

#include "cli/template_command.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "episode/exit_codes.hpp"
#include "cli/seconds_option.hpp"
#include "episode/vm_options.hpp"
#include "common/error.hpp"
#include "common/fd.hpp"
#include "common/file_digest.hpp"
#include "templates/template_build.hpp"
#include "templates/template_store.hpp"
#include "templates/tool.hpp"

extern char** environ;

namespace agentvm {
namespace {

using Json = nlohmann::json;

struct BuildOptions {
    std::string name;
    std::string from;
    std::string containerfile;
    std::string context;
    std::string packages;
    std::vector<std::string> copies;
    std::vector<std::string> env;
    std::string workdir;
    std::string user;
    std::vector<std::string> run;
    std::vector<std::string> warm_up;
    uint32_t cpus = 1;
    uint64_t mem_mib = 512;
    uint64_t disk_mib = 4096;
    std::string store;
    bool no_bake = false;
    double boot_timeout_s = 300;
};

struct NamedOptions {
    std::string name;
    std::string store;
    bool json = false;
    double boot_timeout_s = 300;
};

// What the template's snapshot depends on beyond its image: what runs in the bake, the VM's
// shape, and the VMM and kernel that made it (a snapshot is refused by any other).
std::string snapshot_key(const Json& manifest)
{
    const Json inputs{{"image", manifest.value("image_key", "")},
                      {"run", manifest.value("run", Json::array())},
                      {"warm_up", manifest.value("warm_up", Json::array())},
                      {"cpus", manifest.value("cpus", 1)},
                      {"mem_mib", manifest.value("mem_mib", 512)},
                      {"agentvm", content_digest_of(agentvm_binary())},
                      {"kernel", content_digest_of(default_guest_file("vmlinux"))}};
    return sha256_hex(inputs.dump());
}

// Runs `agentvm snapshot bake` for the template, its output going to ours; returns its status.
int spawn_bake(const TemplateStore& store, const std::string& name, const Json& manifest, double boot_timeout_s)
{
    std::vector<std::string> argv = {agentvm_binary(),
                                     "--log-level",
                                     std::string(spdlog::level::to_string_view(spdlog::get_level()).data()),
                                     "snapshot",
                                     "bake",
                                     "--template",
                                     name,
                                     "--template-store",
                                     store.root().string(),
                                     "--out",
                                     store.snapshot_of(name).string(),
                                     "--cpus",
                                     std::to_string(manifest.value("cpus", 1)),
                                     "--mem",
                                     std::to_string(manifest.value("mem_mib", 512)),
                                     "--boot-timeout",
                                     fmt::format("{}", boot_timeout_s)};
    for (const auto& command : manifest.value("run", std::vector<std::string>{}))
        argv.insert(argv.end(), {"--run", command});
    for (const auto& command : manifest.value("warm_up", std::vector<std::string>{}))
        argv.insert(argv.end(), {"--warm-up", command});
    std::vector<char*> c_argv;
    for (std::string& arg : argv)
        c_argv.push_back(arg.data());
    c_argv.push_back(nullptr);
    pid_t pid = -1;
    if (const int err = ::posix_spawn(&pid, c_argv[0], nullptr, nullptr, c_argv.data(), environ); err != 0)
        throw_errno("starting agentvm snapshot bake", err);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            throw_errno("waiting for agentvm snapshot bake");
    return WIFEXITED(status) ? WEXITSTATUS(status) : exit_code::signal_base + WTERMSIG(status);
}

// Bakes the template's snapshot unless the one it has is current. The store's lock is held.
int bake(const TemplateStore& store, const std::string& name, double boot_timeout_s)
{
    auto manifest = store.read(name);
    if (!manifest)
        throw Error(fmt::format("no template '{}' in '{}'", name, store.root().string()));
    const std::string key = snapshot_key(*manifest);
    const auto snapshot = store.snapshot_of(name);
    if (store.baked(name, *manifest) && (*manifest)["snapshot"].value("key", "") == key) {
        spdlog::info("template '{}': its snapshot is current", name);
        return exit_code::ok;
    }
    (*manifest)["snapshot"] = nullptr;
    store.write(name, *manifest);
    std::error_code ec;
    std::filesystem::remove_all(snapshot, ec);
    const auto start = std::chrono::steady_clock::now();
    spdlog::info("template '{}': baking its snapshot (booting it{})", name,
                 manifest->value("run", Json::array()).empty() ? "" : ", then its --run steps");
    const int status = spawn_bake(store, name, *manifest, boot_timeout_s);
    if (status != exit_code::ok) {
        std::filesystem::remove_all(snapshot, ec);
        spdlog::error("template '{}': baking its snapshot failed (above); its image is built, "
                      "`agentvm template bake {}` tries again",
                      name, name);
        return status;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    (*manifest)["snapshot"] = Json{{"key", key}, {"baked_at", utc_timestamp()}, {"bake_seconds", seconds}};
    store.write(name, *manifest);
    spdlog::info("template '{}': snapshot baked in {:.1f} s", name, seconds);
    return exit_code::ok;
}

// AGENTVM_DEBIAN_MIRROR, else the Debian mirror this host's apt uses (rootfs/apt_mirror.sh,
// which set-up puts beside the guest's files), as the default guest's build does.
std::string debian_mirror()
{
    if (const char* given = std::getenv("AGENTVM_DEBIAN_MIRROR"); given && *given)
        return given;
    const std::string finder = default_guest_file("apt_mirror.sh");
    const std::string found = run_tool({"bash", finder}, {.what = "finding this host's Debian mirror (" + finder + ")"});
    const std::string mirror = found.substr(0, found.find(' '));
    if (mirror.empty())
        throw Error("no Debian mirror in this host's apt sources; set AGENTVM_DEBIAN_MIRROR=URI");
    return mirror;
}

void refuse_default(const std::string& name, const char* what)
{
    check_template_name(name);
    if (name == default_template_name)
        throw Error(fmt::format("'default' is set-up's own guest (./setup.sh builds and bakes it); it cannot be {}",
                                what));
}

int run_build(const BuildOptions& options)
{
    refuse_default(options.name, "built here");
    TemplateRecipe recipe;
    recipe.name = options.name;
    const int sources = !options.from.empty() + !options.containerfile.empty() + !options.packages.empty();
    if (sources != 1)
        throw Error("name the template's source: one of --from, --containerfile or --packages");
    if (!options.context.empty() && options.containerfile.empty())
        throw Error("--context goes with --containerfile");
    if (!options.from.empty())
        recipe.source = parse_from(options.from);
    else if (!options.containerfile.empty())
        recipe.source = containerfile_source(options.containerfile, options.context);
    else
        recipe.source = packages_source(options.packages, debian_mirror());
    for (const std::string& copy : options.copies)
        recipe.copies.push_back(parse_copy(copy));
    for (const std::string& entry : options.env)
        check_env_entry(entry);
    recipe.env = options.env;
    if (!options.workdir.empty() && options.workdir.front() != '/')
        throw Error(fmt::format("--workdir '{}': must be an absolute path", options.workdir));
    recipe.workdir = options.workdir;
    recipe.user = options.user;
    recipe.run = options.run;
    recipe.warm_up = options.warm_up;
    recipe.cpus = options.cpus;
    recipe.mem_mib = options.mem_mib;
    recipe.disk_mib = options.disk_mib;
    const GuestBinaries guest{default_guest_file("agentvm-init"), default_guest_file("agent/agentvm-agent")};
    for (const auto& binary : {guest.init, guest.agent})
        if (!std::filesystem::exists(binary))
            throw Error(fmt::format("'{}' not found: ./setup.sh build makes agentvm's guest binaries", binary.string()));

    const TemplateStore store(TemplateStore::root_from(options.store));
    enter_private_mount_namespace();
    const Fd lock = store.lock_for_build();
    build_template_image(store, recipe, guest);
    if (options.no_bake) {
        spdlog::info("template '{}': not baked (--no-bake); `agentvm template bake {}` bakes it where guests boot",
                     options.name, options.name);
        return exit_code::ok;
    }
    return bake(store, options.name, options.boot_timeout_s);
}

int run_bake_command(const NamedOptions& options)
{
    refuse_default(options.name, "baked here");
    const TemplateStore store(TemplateStore::root_from(options.store));
    const Fd lock = store.lock_for_build();
    return bake(store, options.name, options.boot_timeout_s);
}

Json default_template()
{
    const std::string snapshot = default_guest_file("snapshot");
    std::error_code ec;
    return Json{{"name", default_template_name},
                {"source", "set-up's guest (./setup.sh)"},
                {"rootfs", default_guest_file("rootfs.ext4")},
                {"snapshot", std::filesystem::exists(snapshot + "/manifest.json", ec) ? Json(snapshot) : Json()}};
}

int run_list(const NamedOptions& options)
{
    const TemplateStore store(TemplateStore::root_from(options.store));
    std::vector<Json> templates = store.list();
    templates.insert(templates.begin(), default_template());
    if (options.json) {
        std::printf("%s\n", Json(templates).dump().c_str());
        return exit_code::ok;
    }
    std::printf("%-24s %-8s %10s %10s  %s\n", "NAME", "BAKED", "DISK MiB", "ON DISK", "SOURCE");
    for (const Json& t : templates) {
        const bool baked = !t.value("snapshot", Json()).is_null();
        const std::string disk = t.contains("disk_mib") ? std::to_string(t.value("disk_mib", 0)) : "-";
        const std::string used =
            t.contains("image_bytes") ? fmt::format("{:.1f} MiB", t.value("image_bytes", 0.0) / 1048576.0) : "-";
        std::printf("%-24s %-8s %10s %10s  %s\n", t.value("name", "?").c_str(),
                    t.value("broken", false) ? "broken" : (baked ? "yes" : "no"), disk.c_str(), used.c_str(),
                    t.value("source", "").c_str());
    }
    return exit_code::ok;
}

int run_inspect(const NamedOptions& options)
{
    check_template_name(options.name);
    if (options.name == default_template_name) {
        std::printf("%s\n", default_template().dump(2).c_str());
        return exit_code::ok;
    }
    const TemplateStore store(TemplateStore::root_from(options.store));
    const auto manifest = store.read(options.name);
    if (!manifest)
        throw Error(fmt::format("no template '{}' in '{}'", options.name, store.root().string()));
    Json shown = *manifest;
    shown["rootfs"] = store.base_image(manifest->value("base_key", "")).string();
    shown["layer"]["file"] = store.layer_of(options.name).string();
    if (!shown["snapshot"].is_null())
        shown["snapshot"]["dir"] = store.snapshot_of(options.name).string();
    std::printf("%s\n", shown.dump(2).c_str());
    return exit_code::ok;
}

int run_rm(const NamedOptions& options)
{
    refuse_default(options.name, "removed");
    const TemplateStore store(TemplateStore::root_from(options.store));
    const Fd lock = store.lock_for_build();
    const auto manifest = store.read(options.name);
    store.remove(options.name);
    // A Containerfile's build stays in buildah's own storage under our name (its layer cache
    // for the next build): it goes with the template.
    if (manifest && manifest->value("source", "").starts_with("containerfile:")) {
        try {
            run_tool({"buildah", "rmi", "localhost/agentvm-template-" + options.name},
                     {.what = "removing the template's build from buildah's storage"});
        } catch (const Error& e) {
            spdlog::warn("{}", e.what());
        }
    }
    // A base no template is built from any more goes too.
    std::set<std::string> used;
    for (const Json& t : store.list())
        used.insert(t.value("base_key", ""));
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(store.bases(), ec))
        if (!used.contains(entry.path().stem().string()))
            std::filesystem::remove(entry.path(), ec);
    spdlog::info("template '{}' removed", options.name);
    return exit_code::ok;
}

void add_store_option(CLI::App& command, std::string& store)
{
    command.add_option("--store", store, "the template store (default: AGENTVM_TEMPLATES, else /var/lib/agentvm/templates)");
}

} // namespace

std::vector<Subcommand> add_template_commands(CLI::App& app)
{
    auto* group = app.add_subcommand("template", "Build episode images from your own environment, and manage them");
    group->require_subcommand(1);

    auto build_options = std::make_shared<BuildOptions>();
    auto* build = group->add_subcommand(
        "build", "Build template NAME from an image, a Containerfile, a directory or Debian packages, then bake its "
                 "snapshot");
    build->add_option("name", build_options->name, "the template's name")->required();
    build->add_option("--from", build_options->from,
                      "the source: oci-archive:PATH, docker-archive:PATH, oci:DIR[:TAG] or dir:PATH");
    build->add_option("--containerfile", build_options->containerfile,
                      "build this Containerfile (buildah, --isolation chroot; FROM a local archive: no registry)");
    build->add_option("--context", build_options->context, "the Containerfile's build context (default: its directory)");
    build->add_option("--packages", build_options->packages,
                      "a,b,c: the default guest's Debian 12 with these packages added (debootstrap)");
    build->add_option("--copy", build_options->copies, "HOST_PATH:IMAGE_PATH, copied into the image (repeatable)")->expected(1);
    build->add_option("--env", build_options->env, "KEY=VALUE for every tool call, over the image's Env (repeatable)")->expected(1);
    build->add_option("--workdir", build_options->workdir, "the tool calls' working directory, over the image's WorkingDir");
    build->add_option("--user", build_options->user,
                      "USER[:GROUP] or UID[:GID] the tool calls run as, over the image's User (names from the "
                      "image's /etc/passwd and /etc/group)");
    build->add_option("--run", build_options->run,
                      "a shell command run in the template's VM before its snapshot; must exit 0 (repeatable)")
        ->expected(1);
    build->add_option("--warm-up", build_options->warm_up,
                      "as --run, after them: load what episodes will use into the snapshot (repeatable)")->expected(1);
    build->add_option("--cpus", build_options->cpus, "the template's vCPUs")->capture_default_str()->check(CLI::Range(1, 256));
    build->add_option("--mem", build_options->mem_mib, "the template's memory in MiB")
        ->capture_default_str()
        ->check(CLI::Range(uint64_t{64}, uint64_t{1} << 20));
    build->add_option("--disk-size", build_options->disk_mib, "the template's root disk in MiB (sparse)")
        ->capture_default_str()
        ->check(CLI::Range(uint64_t{64}, uint64_t{1} << 20));
    build->add_flag("--no-bake", build_options->no_bake,
                    "build the image only (a host that cannot boot guests); `agentvm template bake` later");
    build->add_option("--boot-timeout", build_options->boot_timeout_s, "seconds the template's VM gets to get ready")
        ->capture_default_str()
        ->check(seconds_option());
    add_store_option(*build, build_options->store);

    auto bake_options = std::make_shared<NamedOptions>();
    auto* bake_command = group->add_subcommand("bake", "Bake template NAME's snapshot (if it is not current)");
    bake_command->add_option("name", bake_options->name, "the template's name")->required();
    bake_command->add_option("--boot-timeout", bake_options->boot_timeout_s, "seconds the VM gets to get ready")
        ->capture_default_str()
        ->check(seconds_option());
    add_store_option(*bake_command, bake_options->store);

    auto list_options = std::make_shared<NamedOptions>();
    auto* list = group->add_subcommand("list", "List the templates");
    list->add_flag("--json", list_options->json, "print them as one JSON array");
    add_store_option(*list, list_options->store);

    auto inspect_options = std::make_shared<NamedOptions>();
    auto* inspect = group->add_subcommand("inspect", "Print template NAME's manifest");
    inspect->add_option("name", inspect_options->name, "the template's name")->required();
    add_store_option(*inspect, inspect_options->store);

    auto rm_options = std::make_shared<NamedOptions>();
    auto* rm = group->add_subcommand("rm", "Remove template NAME, any base image no other template uses, and a "
                                           "Containerfile template's image in buildah's storage");
    rm->add_option("name", rm_options->name, "the template's name")->required();
    add_store_option(*rm, rm_options->store);

    return {
        {build, [build_options] { return run_build(*build_options); }},
        {bake_command, [bake_options] { return run_bake_command(*bake_options); }},
        {list, [list_options] { return run_list(*list_options); }},
        {inspect, [inspect_options] { return run_inspect(*inspect_options); }},
        {rm, [rm_options] { return run_rm(*rm_options); }},
    };
}

} // namespace agentvm
