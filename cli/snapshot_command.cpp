#include <CLI/CLI.hpp>

#include "cli/snapshot_command.hpp"

#include <memory>

#include <fmt/format.h>

#include "cli/seconds_option.hpp"
#include "cli/vm_flags.hpp"
#include "common/error.hpp"
#include "episode/bake_session.hpp"
#include "episode/default_snapshot.hpp"
#include "episode/supervised.hpp"

namespace agentvm {

Subcommand add_snapshot_command(CLI::App& app)
{
    auto* snapshot = app.add_subcommand("snapshot", "Make snapshots that run and episode restore from");
    snapshot->require_subcommand(1);
    auto* bake = snapshot->add_subcommand(
        "bake", "Boot a VM, wait until its agent is ready and idle, and save it to a snapshot directory");
    auto options = std::make_shared<BakeSettings>();
    auto* out = bake->add_option("--out", options->out, "the snapshot directory to create (must not exist)");
    auto as_default = std::make_shared<bool>(false);
    bake->add_flag("--default", *as_default,
                   "bake the default guest's snapshot where run and episode look for it (replacing the one there), "
                   "instead of --out: /var/lib/agentvm/snapshot when installed")
        ->excludes(out);
    add_vm_flags(*bake, options->vm);
    bake->add_option("--boot-timeout", options->boot_timeout_s,
                     "seconds the guest agent gets to answer after the VM starts")
        ->capture_default_str()
        ->check(seconds_option());
    bake->add_flag("--json", options->json, "print a JSON summary on stdout");
    bake->add_option("--run", options->run,
                     "a shell command (/bin/sh -c) to run in the guest before the snapshot, which fails the bake "
                     "unless it exits 0; what it writes to the disk is in the snapshot (repeatable, in order)")
        ->expected(1);
    bake->add_option("--warm-up", options->warm_up,
                     "as --run, after the --run steps: a command that loads what episodes will use (repeatable)")->expected(1);
    bake->add_option("--step-timeout", options->step_timeout_s, "seconds each --run or --warm-up command may take")
        ->capture_default_str()
        ->check(seconds_option());
    return {bake, [options, as_default] {
                if (*as_default) {
                    for (const char* flag : {"--template", "--kernel", "--rootfs", "--cmdline"})
                        if (options->vm.given(flag))
                            throw Error(fmt::format("--default bakes the default guest as it is; {} would make "
                                                    "another, which belongs in --out",
                                                    flag));
                    options->out = default_snapshot_out();
                } else if (options->out.empty()) {
                    throw Error("name the snapshot directory: --out DIR, or --default for the default guest's");
                }
                return run_supervised(options->vm, 0, [&] { return run_bake(*options); });
            }};
}

} // namespace agentvm
