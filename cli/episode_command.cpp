#include <CLI/CLI.hpp>

#include "cli/episode_command.hpp"

#include <memory>

#include "cli/egress_host.hpp"
#include "cli/seconds_option.hpp"
#include "cli/vm_flags.hpp"
#include "episode/episode_session.hpp"
#include "episode/supervised.hpp"
#include "protocol/agent_protocol.hpp"

namespace agentvm {

Subcommand add_episode_command(CLI::App& app)
{
    auto* episode = app.add_subcommand(
        "episode", "Boot a VM and serve tool calls as JSON lines on stdin/stdout until stdin ends");
    auto options = std::make_shared<EpisodeSettings>();
    add_vm_flags(*episode, options->vm);
    auto egress = std::make_shared<EgressFlags>();
    add_egress_flags(*episode, *egress);
    episode->add_option("--boot-timeout", options->boot_timeout_s,
                        "seconds the guest agent gets to answer after the VM starts")
        ->capture_default_str()
        ->check(seconds_option());
    episode->add_option("--call-timeout", options->call_timeout_s,
                        "seconds an exec or shell call without its own \"timeout\" may run; then its "
                        "whole process group is killed")
        ->capture_default_str()
        ->check(seconds_option(false, max_call_timeout_s));
    episode->add_option("--snapshot-dir", options->snapshot_dir,
                        "a directory where {\"op\":\"snapshot\",\"name\":NAME} calls write live snapshots of the "
                        "running VM (DIR/NAME), which `agentvm episode --snapshot DIR/NAME` continues from")
        ->check(CLI::ExistingDirectory);
    episode->add_flag("--announce-ready", options->announce_ready,
                      "once the guest agent answers, write {\"event\":\"ready\",\"restored\":BOOL} as the "
                      "first line on stdout (for a pool that keeps episodes ready)");
    return {episode, [options, egress] {
                const std::unique_ptr<EgressHost> proxy = EgressHost::start(*egress, options->vm.request().vsock_uds,
                                                                            options->vm.jail_identity());
                if (proxy)
                    options->env.merge(egress_proxy_env());
                return run_supervised(options->vm, 0, [&] { return run_episode(*options); });
            }};
}

} // namespace agentvm
