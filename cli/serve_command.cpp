#include <CLI/CLI.hpp>

#include "cli/serve_command.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/error.hpp"

namespace agentvm {

Subcommand add_serve_command(CLI::App& app)
{
    auto* serve = app.add_subcommand("serve", "Run the per-host sandbox service: an HTTP API over warm VMs "
                                              "(agentvm serve --help lists its options)");
    // Everything after `serve`, --help included, is agentvm-serve's to parse.
    serve->prefix_command();
    serve->set_help_flag();
    return {serve, [serve]() -> int {
                const auto program = std::filesystem::read_symlink("/proc/self/exe").parent_path() / "agentvm-serve";
                std::vector<std::string> args = serve->remaining();
                std::vector<char*> argv{const_cast<char*>("agentvm-serve")};
                for (std::string& arg : args)
                    argv.push_back(arg.data());
                argv.push_back(nullptr);
                ::execv(program.c_str(), argv.data());
                throw Error(fmt::format("cannot run {}: {} (it is built beside agentvm: ninja -C build)",
                                        program.string(), std::strerror(errno)));
            }};
}

} // namespace agentvm
