#include <CLI/CLI.hpp>

#include "cli/run_command.hpp"

#include <memory>

#include "cli/egress_host.hpp"
#include "cli/seconds_option.hpp"
#include "cli/vm_flags.hpp"
#include "episode/exit_codes.hpp"
#include "episode/run_session.hpp"
#include "episode/supervised.hpp"
#include "protocol/agent_protocol.hpp"

namespace agentvm {

Subcommand add_run_command(CLI::App& app)
{
    auto* run = app.add_subcommand("run", "Boot a fresh VM, run one command in it, and exit with its status");
    auto options = std::make_shared<RunSettings>();
    add_vm_flags(*run, options->vm);
    auto egress = std::make_shared<EgressFlags>();
    add_egress_flags(*run, *egress);
    run->add_option("--boot-timeout", options->boot_timeout_s,
                    "seconds the guest agent gets to answer after the VM starts")
        ->capture_default_str()
        ->check(seconds_option());
    run->add_option("--timeout", options->timeout_s,
                    "seconds the command may run; then its whole process group is killed (exit 124)")
        ->capture_default_str()
        ->check(seconds_option(false, max_call_timeout_s));
    // One value per --env: a vector option otherwise takes the command's own words after `--`.
    run->add_option("--env", options->env, "NAME=VALUE added to the command's environment (repeatable)")
        ->allow_extra_args(false);
    run->add_option("--workdir", options->workdir, "directory in the guest to run the command in");
    run->add_option("--max-output", options->max_output,
                    "bytes of stdout and of stderr passed on; the rest is dropped, with a warning")
        ->capture_default_str();
    run->add_flag("-i,--stdin", options->forward_stdin, "pass this process's stdin to the command");
    run->add_option("--shell", options->shell, "run STRING with bash -c instead of a command after --");
    run->add_option("command", options->argv, "the command and its arguments, after --");
    return {run,
            [options, egress] {
                const std::unique_ptr<EgressHost> proxy = EgressHost::start(*egress, options->vm.request().vsock_uds,
                                                                            options->vm.jail_identity());
                if (proxy) {
                    std::vector<std::string> env;
                    for (const auto& [name, value] : egress_proxy_env())
                        env.push_back(name + "=" + value);
                    env.insert(env.end(), options->env.begin(), options->env.end());  // the user's win
                    options->env = std::move(env);
                }
                return run_supervised(options->vm, exit_code::run_failure, [&] { return run_one_command(*options); });
            },
            exit_code::run_failure};
}

} // namespace agentvm
