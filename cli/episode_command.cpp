#include <CLI/CLI.hpp>

#include "cli/episode_command.hpp"

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cli/agent_vm.hpp"
#include "cli/episode_relay.hpp"
#include "cli/live_snapshot.hpp"
#include "cli/exit_codes.hpp"
#include "cli/seconds_option.hpp"
#include "cli/supervised.hpp"
#include "cli/vm_options.hpp"
#include "protocol/agent_protocol.hpp"

namespace agentvm {
namespace {

struct EpisodeOptions {
    VmOptions vm{VmRole::agent};
    double boot_timeout_s = 60;
    double call_timeout_s = EpisodeRelay::default_call_timeout_s;
    bool announce_ready = false;
    std::string snapshot_dir;  // where "snapshot" calls write (--snapshot-dir); empty: refused
};

// The error every unanswered call gets, from how the VM and the relay ended.
struct Failure {
    std::string code;
    std::string message;
};

std::optional<Failure> failure_of(const VmResult& result, bool time_ran_out,
                                  std::optional<EpisodeRelay::End> relay_end, const std::string& relay_why)
{
    using End = EpisodeRelay::End;
    if (time_ran_out)
        return Failure{"episode_timeout", result.detail};
    switch (result.outcome) {
    case VmOutcome::finished:
        return std::nullopt;
    case VmOutcome::panicked:
        return Failure{"vm_died", "the guest kernel panicked: " + result.detail};
    case VmOutcome::powered_off:
        return Failure{"vm_died", "the guest powered off: " + result.detail};
    case VmOutcome::stopped:
        return Failure{"stopped", "agentvm was stopped: " + result.detail};
    case VmOutcome::failed:
        break;
    }
    if (!relay_end)
        return Failure{"vm_died", "the VM failed: " + result.detail};
    switch (*relay_end) {
    case End::agent_lost:
    case End::agent_protocol:
        return Failure{"agent_died", relay_why};
    case End::watchdog:
        return Failure{"watchdog", relay_why};
    case End::output_failed:
    case End::finished:
        break;
    }
    return Failure{"vm_died", relay_why};
}

int run_episode(EpisodeOptions& options)
{
    if (!options.snapshot_dir.empty()) {
        // By its absolute name: the jailed VMM resolves names from another working directory.
        options.snapshot_dir = std::filesystem::absolute(options.snapshot_dir).lexically_normal().string();
        options.vm.allow_live_snapshots(options.snapshot_dir);
    }
    AgentVm agent_vm(options.vm, seconds_to_ms(options.boot_timeout_s));
    std::optional<SnapshotWriter> snapshots;
    if (!options.snapshot_dir.empty())
        snapshots.emplace(agent_vm.kvm(), agent_vm.vm().config(), agent_vm.origin());
    std::optional<EpisodeRelay::End> relay_end;
    std::string relay_why;
    EpisodeRelay relay(agent_vm.vm().event_loop(), STDIN_FILENO, STDOUT_FILENO,
                       [&](EpisodeRelay::End how, const std::string& why) {
                           relay_end = how;
                           relay_why = why;
                           if (how == EpisodeRelay::End::finished)
                               agent_vm.finish("the episode ended");
                           else if (how == EpisodeRelay::End::agent_lost)
                               agent_vm.fail_unless_vm_ends(why);
                           else
                               agent_vm.fail(why);
                       },
                       EpisodeRelay::watchdog_grace, options.call_timeout_s);
    if (snapshots)
        relay.on_snapshot([&](const std::string& name, std::function<void(Json)> answer) {
            take_live_snapshot(agent_vm.vm(), *snapshots, options.snapshot_dir + "/" + name, std::move(answer));
        });
    const auto on_connected = [&](Fd agent) {
        relay.start(std::move(agent),
                    options.announce_ready ? to_line(Json{{"event", "ready"}, {"restored", agent_vm.restored()}})
                                           : std::string());
    };
    const VmResult result = agent_vm.run(on_connected, [&] { relay.stop_output(); });

    const std::optional<Failure> failure = failure_of(result, agent_vm.time_ran_out(), relay_end, relay_why);
    if (failure) {
        const size_t unanswered = relay.fail_pending(failure->code, failure->message);
        spdlog::error("{}{}", failure->message,
                      unanswered ? fmt::format(" ({} call(s) answered with error '{}')", unanswered, failure->code)
                                 : "");
    }
    relay.flush_output();
    if (relay_end == EpisodeRelay::End::output_failed)
        return exit_code::error;
    if (agent_vm.time_ran_out())
        return exit_code::episode_timed_out;
    // Only the harness ends an episode: a guest that powers off by itself has failed it.
    if (result.outcome == VmOutcome::powered_off)
        return exit_code::vm_failure;
    return exit_code::from(result, agent_vm.stop_signal());
}

} // namespace

Subcommand add_episode_command(CLI::App& app)
{
    auto* episode = app.add_subcommand(
        "episode", "Boot a VM and serve tool calls as JSON lines on stdin/stdout until stdin ends");
    auto options = std::make_shared<EpisodeOptions>();
    options->vm.add_to(*episode);
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
    return {episode, [options] { return run_supervised(options->vm, 0, [&] { return run_episode(*options); }); }};
}

} // namespace agentvm
