#include "cli/live_snapshot.hpp"

#include <chrono>

#include <spdlog/spdlog.h>

namespace agentvm {
namespace {

using Clock = std::chrono::steady_clock;

// Parking the vCPUs takes microseconds and the disk's requests milliseconds; a VM that needs
// longer is wedged, and is left running rather than waited for.
constexpr std::chrono::milliseconds pause_patience{5000};

double ms_between(Clock::time_point from, Clock::time_point to)
{
    return std::chrono::duration<double, std::milli>(to - from).count();
}

Json failure(const std::string& message)
{
    return Json{{"error", {{"code", "snapshot_failed"}, {"message", message}}}};
}

} // namespace

void take_live_snapshot(Vm& vm, const SnapshotWriter& writer, const std::string& dir,
                        std::function<void(Json answer)> answer)
{
    const auto start = Clock::now();
    vm.pause(
        [&vm, &writer, dir, start, answer = std::move(answer)](const std::string& error) {
            if (!error.empty()) {
                answer(failure("pausing the VM: " + error));
                return;
            }
            Clock::time_point resumed;
            try {
                const SnapshotSummary summary = writer.write_live(vm, dir, [&] {
                    vm.resume();
                    resumed = Clock::now();
                });
                const auto done = Clock::now();
                spdlog::debug("live snapshot '{}': {} bytes of memory, {} of disk; paused {:.2f} ms, {:.2f} ms in all",
                              summary.dir, summary.memory_data_bytes, summary.disk_data_bytes,
                              ms_between(start, resumed), ms_between(start, done));
                answer(Json{{"snapshot",
                             {{"path", summary.dir},
                              {"memory_bytes", summary.memory_data_bytes},
                              {"disk_bytes", summary.disk_data_bytes},
                              {"state_bytes", summary.state_bytes},
                              {"pause_ms", ms_between(start, resumed)},
                              {"ms", ms_between(start, done)}}}});
            } catch (const std::exception& e) {
                answer(failure(e.what()));
            }
        },
        pause_patience);
}

} // namespace agentvm
