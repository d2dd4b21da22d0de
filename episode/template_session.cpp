#include "episode/template_session.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "common/fd.hpp"
#include "common/file_digest.hpp"
#include "episode/exit_codes.hpp"
#include "episode/guest_location.hpp"
#include "episode/vm_options.hpp"
#include "templates/template_build.hpp"
#include "templates/template_store.hpp"
#include "templates/tool.hpp"

extern char** environ;

namespace agentvm {
namespace {

// Manifests are templates/' plain nlohmann::json, not protocol/'s ordered agentvm::Json: the public
// functions below, outside this namespace, spell it out.
using Json = nlohmann::json;

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

Json default_template()
{
    const std::string snapshot = default_guest().snapshot.string();
    std::error_code ec;
    return Json{{"name", default_template_name},
                {"source", "set-up's guest (./setup.sh)"},
                {"rootfs", default_guest_file("rootfs.ext4")},
                {"snapshot", std::filesystem::exists(snapshot + "/manifest.json", ec) ? Json(snapshot) : Json()}};
}

} // namespace

int build_template(const TemplateBuildSettings& settings)
{
    refuse_default(settings.name, "built here");
    TemplateRecipe recipe;
    recipe.name = settings.name;
    const int sources = !settings.from.empty() + !settings.containerfile.empty() + !settings.packages.empty();
    if (sources != 1)
        throw Error("name the template's source: one of --from, --containerfile or --packages");
    if (!settings.context.empty() && settings.containerfile.empty())
        throw Error("--context goes with --containerfile");
    if (!settings.from.empty())
        recipe.source = parse_from(settings.from);
    else if (!settings.containerfile.empty())
        recipe.source = containerfile_source(settings.containerfile, settings.context);
    else
        recipe.source = packages_source(settings.packages, debian_mirror());
    for (const std::string& copy : settings.copies)
        recipe.copies.push_back(parse_copy(copy));
    for (const std::string& entry : settings.env)
        check_env_entry(entry);
    recipe.env = settings.env;
    if (!settings.workdir.empty() && settings.workdir.front() != '/')
        throw Error(fmt::format("--workdir '{}': must be an absolute path", settings.workdir));
    recipe.workdir = settings.workdir;
    recipe.user = settings.user;
    recipe.run = settings.run;
    recipe.warm_up = settings.warm_up;
    recipe.cpus = settings.cpus;
    recipe.mem_mib = settings.mem_mib;
    recipe.disk_mib = settings.disk_mib;
    const GuestBinaries guest{default_guest_file("agentvm-init"), default_guest_file("agent/agentvm-agent")};
    for (const auto& binary : {guest.init, guest.agent})
        if (!std::filesystem::exists(binary))
            throw Error(fmt::format("'{}' not found: ./setup.sh build makes agentvm's guest binaries", binary.string()));

    const TemplateStore store(TemplateStore::root_from(settings.store));
    enter_private_mount_namespace();
    const Fd lock = store.lock_for_build();
    build_template_image(store, recipe, guest);
    if (settings.no_bake) {
        spdlog::info("template '{}': not baked (--no-bake); `agentvm template bake {}` bakes it where guests boot",
                     settings.name, settings.name);
        return exit_code::ok;
    }
    return bake(store, settings.name, settings.boot_timeout_s);
}

int bake_template(const TemplateSettings& settings)
{
    refuse_default(settings.name, "baked here");
    const TemplateStore store(TemplateStore::root_from(settings.store));
    const Fd lock = store.lock_for_build();
    return bake(store, settings.name, settings.boot_timeout_s);
}

int list_templates(const TemplateSettings& settings)
{
    const TemplateStore store(TemplateStore::root_from(settings.store));
    std::vector<nlohmann::json> templates = store.list();
    templates.insert(templates.begin(), default_template());
    if (settings.json) {
        std::printf("%s\n", nlohmann::json(templates).dump().c_str());
        return exit_code::ok;
    }
    std::printf("%-24s %-8s %10s %10s  %s\n", "NAME", "BAKED", "DISK MiB", "ON DISK", "SOURCE");
    for (const nlohmann::json& t : templates) {
        const bool baked = !t.value("snapshot", nlohmann::json()).is_null();
        const std::string disk = t.contains("disk_mib") ? std::to_string(t.value("disk_mib", 0)) : "-";
        const std::string used =
            t.contains("image_bytes") ? fmt::format("{:.1f} MiB", t.value("image_bytes", 0.0) / 1048576.0) : "-";
        std::printf("%-24s %-8s %10s %10s  %s\n", t.value("name", "?").c_str(),
                    t.value("broken", false) ? "broken" : (baked ? "yes" : "no"), disk.c_str(), used.c_str(),
                    t.value("source", "").c_str());
    }
    return exit_code::ok;
}

int inspect_template(const TemplateSettings& settings)
{
    check_template_name(settings.name);
    if (settings.name == default_template_name) {
        std::printf("%s\n", default_template().dump(2).c_str());
        return exit_code::ok;
    }
    const TemplateStore store(TemplateStore::root_from(settings.store));
    const auto manifest = store.read(settings.name);
    if (!manifest)
        throw Error(fmt::format("no template '{}' in '{}'", settings.name, store.root().string()));
    nlohmann::json shown = *manifest;
    shown["rootfs"] = store.base_image(manifest->value("base_key", "")).string();
    shown["layer"]["file"] = store.layer_of(settings.name).string();
    if (!shown["snapshot"].is_null())
        shown["snapshot"]["dir"] = store.snapshot_of(settings.name).string();
    std::printf("%s\n", shown.dump(2).c_str());
    return exit_code::ok;
}

int remove_template(const TemplateSettings& settings)
{
    refuse_default(settings.name, "removed");
    const TemplateStore store(TemplateStore::root_from(settings.store));
    const Fd lock = store.lock_for_build();
    const auto manifest = store.read(settings.name);
    store.remove(settings.name);
    // A Containerfile's build stays in buildah's own storage under our name (its layer cache
    // for the next build): it goes with the template.
    if (manifest && manifest->value("source", "").starts_with("containerfile:")) {
        try {
            run_tool({"buildah", "rmi", "localhost/agentvm-template-" + settings.name},
                     {.what = "removing the template's build from buildah's storage"});
        } catch (const Error& e) {
            spdlog::warn("{}", e.what());
        }
    }
    // A base no template is built from any more goes too.
    std::set<std::string> used;
    for (const nlohmann::json& t : store.list())
        used.insert(t.value("base_key", ""));
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(store.bases(), ec))
        if (!used.contains(entry.path().stem().string()))
            std::filesystem::remove(entry.path(), ec);
    spdlog::info("template '{}' removed", settings.name);
    return exit_code::ok;
}

} // namespace agentvm
