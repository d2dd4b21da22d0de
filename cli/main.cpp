// agentvm: a KVM microVM monitor for AI-agent episodes.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <vector>

#include "agentvm_config.hpp"
#include "cli/boot_command.hpp"
#include "cli/exit_codes.hpp"
#include "cli/logging.hpp"
#include "vmm/error.hpp"

int main(int argc, char** argv)
{
    CLI::App app{"agentvm: a KVM microVM monitor for AI-agent episodes"};
    app.set_version_flag("--version", "agentvm " AGENTVM_VERSION);
    app.require_subcommand(1);
    std::string log_level = "info";
    app.add_option("--log-level", log_level, "trace, debug, info, warn, error, critical or off")
        ->capture_default_str();

    const std::vector<agentvm::Subcommand> commands = {agentvm::add_boot_command(app)};

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int code = app.exit(e);
        return code == 0 ? 0 : agentvm::exit_code::usage;
    }

    try {
        agentvm::setup_logging(log_level);
        for (const auto& command : commands) {
            if (command.app->parsed())
                return command.run();
        }
    } catch (const std::exception& e) {
        spdlog::error("{}", e.what());
        return agentvm::exit_code::error;
    }
    return agentvm::exit_code::usage;
}
