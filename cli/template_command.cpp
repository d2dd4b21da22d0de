#include <CLI/CLI.hpp>

#include "cli/template_command.hpp"

#include <memory>

#include "cli/seconds_option.hpp"
#include "episode/template_session.hpp"

namespace agentvm {
namespace {

void add_store_option(CLI::App& command, std::string& store)
{
    command.add_option("--store", store, "the template store (default: AGENTVM_TEMPLATES, else /var/lib/agentvm/templates)");
}

} // namespace

std::vector<Subcommand> add_template_commands(CLI::App& app)
{
    auto* group = app.add_subcommand("template", "Build episode images from your own environment, and manage them");
    group->require_subcommand(1);

    auto build_options = std::make_shared<TemplateBuildSettings>();
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

    auto bake_options = std::make_shared<TemplateSettings>();
    auto* bake_command = group->add_subcommand("bake", "Bake template NAME's snapshot (if it is not current)");
    bake_command->add_option("name", bake_options->name, "the template's name")->required();
    bake_command->add_option("--boot-timeout", bake_options->boot_timeout_s, "seconds the VM gets to get ready")
        ->capture_default_str()
        ->check(seconds_option());
    add_store_option(*bake_command, bake_options->store);

    auto list_options = std::make_shared<TemplateSettings>();
    auto* list = group->add_subcommand("list", "List the templates");
    list->add_flag("--json", list_options->json, "print them as one JSON array");
    add_store_option(*list, list_options->store);

    auto inspect_options = std::make_shared<TemplateSettings>();
    auto* inspect = group->add_subcommand("inspect", "Print template NAME's manifest");
    inspect->add_option("name", inspect_options->name, "the template's name")->required();
    add_store_option(*inspect, inspect_options->store);

    auto rm_options = std::make_shared<TemplateSettings>();
    auto* rm = group->add_subcommand("rm", "Remove template NAME, any base image no other template uses, and a "
                                           "Containerfile template's image in buildah's storage");
    rm->add_option("name", rm_options->name, "the template's name")->required();
    add_store_option(*rm, rm_options->store);

    return {
        {build, [build_options] { return build_template(*build_options); }},
        {bake_command, [bake_options] { return bake_template(*bake_options); }},
        {list, [list_options] { return list_templates(*list_options); }},
        {inspect, [inspect_options] { return inspect_template(*inspect_options); }},
        {rm, [rm_options] { return remove_template(*rm_options); }},
    };
}

} // namespace agentvm
