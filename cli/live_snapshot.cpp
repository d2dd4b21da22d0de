#include "cli/live_snapshot.hpp"

#include <chrono>
#include <memory>

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

std::string what(std::exception_ptr failure)
{
    try {
        std::rethrow_exception(failure);
    } catch (const std::exception& e) {
        return e.what();
    }
}

// The steps of one snapshot, each on the thread LiveSnapshot names, sharing what they found.
struct Taking {
    Taking(Vm& v, std::function<void(Json)> a) : vm(v), answer(std::move(a)) {}
    Vm& vm;
    std::unique_ptr<LiveSnapshot> live;
    std::function<void(Json)> answer;
    Clock::time_point start = Clock::now();
    Clock::time_point pause_start;
    Clock::time_point resumed;
};

void finish(const std::shared_ptr<Taking>& taking)
{
    auto summary = std::make_shared<SnapshotSummary>();
    taking->vm.in_background([taking, summary] { *summary = taking->live->finish(); },
                             [taking, summary](std::exception_ptr failed) {
                                 if (failed) {
                                     taking->answer(failure(what(failed)));
                                     return;
                                 }
                                 const auto done = Clock::now();
                                 const LiveSnapshot& live = *taking->live;
                                 spdlog::debug("live snapshot '{}': {} bytes of memory, {} of disk; {} bytes copied "
                                               "running, {} paused; paused {:.2f} ms, {:.2f} ms in all",
                                               summary->dir, summary->memory_data_bytes, summary->disk_data_bytes,
                                               live.running_bytes(), live.paused_bytes(),
                                               ms_between(taking->pause_start, taking->resumed),
                                               ms_between(taking->start, done));
                                 taking->answer(Json{{"snapshot",
                                                      {{"path", summary->dir},
                                                       {"memory_bytes", summary->memory_data_bytes},
                                                       {"disk_bytes", summary->disk_data_bytes},
                                                       {"state_bytes", summary->state_bytes},
                                                       {"copied_running_bytes", live.running_bytes()},
                                                       {"copied_paused_bytes", live.paused_bytes()},
                                                       {"tracked", live.tracked()},
                                                       {"pause_ms", ms_between(taking->pause_start, taking->resumed)},
                                                       {"ms", ms_between(taking->start, done)}}}});
                             });
}

void capture(const std::shared_ptr<Taking>& taking)
{
    taking->pause_start = Clock::now();
    taking->vm.pause(
        [taking](const std::string& error) {
            if (!error.empty()) {
                taking->answer(failure("pausing the VM: " + error));
                return;
            }
            try {
                taking->live->capture(taking->vm);
            } catch (const std::exception& e) {
                taking->vm.resume();
                taking->answer(failure(e.what()));
                return;
            }
            taking->vm.resume();
            taking->resumed = Clock::now();
            finish(taking);
        },
        pause_patience);
}

} // namespace

void take_live_snapshot(Vm& vm, const SnapshotWriter& writer, const std::string& dir,
                        std::function<void(Json answer)> answer)
{
    auto taking = std::make_shared<Taking>(vm, std::move(answer));
    try {
        taking->live = writer.begin_live(vm, dir);
    } catch (const std::exception& e) {
        taking->answer(failure(e.what()));
        return;
    }
    vm.in_background([taking] { taking->live->copy_running(taking->vm); },
                     [taking](std::exception_ptr failed) {
                         if (failed) {
                             taking->answer(failure(what(failed)));
                             return;
                         }
                         capture(taking);
                     });
}

} // namespace agentvm
