#include <CLI/CLI.hpp>

#include "cli/boot_command.hpp"

#include <memory>

#include "cli/vm_flags.hpp"
#include "episode/boot_session.hpp"
#include "episode/supervised.hpp"

namespace agentvm {

Subcommand add_boot_command(CLI::App& app)
{
    auto* boot = app.add_subcommand("boot", "Boot a guest and stay attached until it powers off");
    auto options = std::make_shared<VmOptions>(VmRole::boot);
    add_vm_flags(*boot, *options);
    return {boot, [options] { return run_supervised(*options, 0, [&] { return run_boot(*options); }); }};
}

} // namespace agentvm
