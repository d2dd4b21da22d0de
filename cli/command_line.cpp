#include "cli/command_line.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <vector>

#include "agentvm_config.hpp"
#include "cli/boot_command.hpp"
#include "cli/doctor_command.hpp"
#include "cli/episode_command.hpp"
#include "cli/fleet_command.hpp"
#include "episode/exit_codes.hpp"
#include "cli/logging.hpp"
#include "cli/run_command.hpp"
#include "cli/plan_command.hpp"
#include "cli/port_forward_command.hpp"
#include "cli/serve_command.hpp"
#include "cli/snapshot_command.hpp"
#include "cli/template_command.hpp"
#include "common/error.hpp"
#include "protocol/agent_protocol.hpp"

namespace agentvm {
namespace {

// The subcommand on the command line, even if its parsing failed part-way.
const Subcommand* chosen(const std::vector<Subcommand>& commands)
{
    for (const auto& command : commands)
        if (command.app->parsed())
            return &command;
    return nullptr;
}

} // namespace

int run_command_line(int argc, char** argv)
{
    CLI::App app{"agentvm: a KVM microVM monitor for AI-agent episodes"};
    app.set_version_flag("--version", fmt::format("agentvm {} (agent protocol {})", AGENTVM_VERSION,
                                                  protocol_version));
    app.require_subcommand(1);
    std::string log_level = "info";
    app.add_option("--log-level", log_level, "trace, debug, info, warn, error, critical or off")
        ->capture_default_str();

    std::vector<Subcommand> commands = {
        add_run_command(app),
        add_episode_command(app),
        add_boot_command(app),
        add_snapshot_command(app),
        add_serve_command(app),
        add_plan_command(app),
        add_port_forward_command(app),
        add_doctor_command(app),
    };
    for (Subcommand& command : add_template_commands(app))
        commands.push_back(std::move(command));
    for (Subcommand& command : add_fleet_commands(app))
        commands.push_back(std::move(command));

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int code = app.exit(e);
        if (code == 0)
            return 0;
        const auto* command = chosen(commands);
        return command && command->failure_code ? command->failure_code : exit_code::usage;
    }

    const auto* command = chosen(commands);
    try {
        setup_logging(log_level);
        if (command)
            return command->run();
    } catch (const std::exception& e) {
        spdlog::error("{}", e.what());
        return command && command->failure_code ? command->failure_code : exit_code::error;
    }
    return exit_code::usage;
}

} // namespace agentvm
