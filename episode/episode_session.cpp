#include "episode/episode_session.hpp"

#include <unistd.h>

#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "episode/agent_vm.hpp"
#include "episode/exit_codes.hpp"
#include "episode/seconds.hpp"
#include "protocol/agent_protocol.hpp"
#include "vmm/live_snapshot.hpp"

namespace agentvm {
namespace {

// The "snapshot" op's answer (docs/protocol.md).
Json snapshot_answer(const LiveSnapshotTaken& taken)
{
    return Json{{"snapshot",
                 {{"path", taken.summary.dir},
                  {"memory_bytes", taken.summary.memory_data_bytes},
                  {"disk_bytes", taken.summary.disk_data_bytes},
                  {"state_bytes", taken.summary.state_bytes},
                  {"copied_running_bytes", taken.copied_running_bytes},
                  {"copied_paused_bytes", taken.copied_paused_bytes},
                  {"tracked", taken.tracked},
                  {"pause_ms", taken.pause_ms},
                  {"ms", taken.ms}}}};
}

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

} // namespace

int run_episode(EpisodeSettings& settings)
{
    if (!settings.snapshot_dir.empty()) {
        // By its absolute name: the jailed VMM resolves names from another working directory.
        settings.snapshot_dir = std::filesystem::absolute(settings.snapshot_dir).lexically_normal().string();
        settings.vm.allow_live_snapshots(settings.snapshot_dir);
    }
    AgentVm agent_vm(settings.vm, seconds_to_ms(settings.boot_timeout_s));
    std::optional<SnapshotWriter> snapshots;
    if (!settings.snapshot_dir.empty())
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
                       EpisodeRelay::watchdog_grace, settings.call_timeout_s);
    if (!settings.env.empty())
        relay.preset_env(settings.env);
    if (snapshots)
        relay.on_snapshot([&](const std::string& name, std::function<void(Json)> answer) {
            take_live_snapshot(agent_vm.vm(), *snapshots, settings.snapshot_dir + "/" + name,
                               {[answer](const LiveSnapshotTaken& taken) { answer(snapshot_answer(taken)); },
                                [answer](const std::string& why) {
                                    answer(Json{{"error", {{"code", "snapshot_failed"}, {"message", why}}}});
                                }});
        });
    const auto on_connected = [&](Fd agent) {
        relay.start(std::move(agent),
                    settings.announce_ready ? to_line(Json{{"event", "ready"}, {"restored", agent_vm.restored()}})
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

} // namespace agentvm
