#include "vmm/live_snapshot.hpp"

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
    Taking(Vm& v, LiveSnapshotHandlers h) : vm(v), handlers(std::move(h)) {}
    Vm& vm;
    std::unique_ptr<LiveSnapshot> live;
    LiveSnapshotHandlers handlers;
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
                                     taking->handlers.on_failed(what(failed));
                                     return;
                                 }
                                 const LiveSnapshot& live = *taking->live;
                                 const LiveSnapshotTaken taken{*summary,
                                                               live.running_bytes(),
                                                               live.paused_bytes(),
                                                               live.tracked(),
                                                               ms_between(taking->pause_start, taking->resumed),
                                                               ms_between(taking->start, Clock::now())};
                                 spdlog::debug("live snapshot '{}': {} bytes of memory, {} of disk; {} bytes copied "
                                               "running, {} paused; paused {:.2f} ms, {:.2f} ms in all",
                                               summary->dir, summary->memory_data_bytes, summary->disk_data_bytes,
                                               taken.copied_running_bytes, taken.copied_paused_bytes, taken.pause_ms,
                                               taken.ms);
                                 taking->handlers.on_taken(taken);
                             });
}

void capture(const std::shared_ptr<Taking>& taking)
{
    taking->pause_start = Clock::now();
    taking->vm.pause(
        [taking](const std::string& error) {
            if (!error.empty()) {
                taking->handlers.on_failed("pausing the VM: " + error);
                return;
            }
            try {
                taking->live->capture(taking->vm);
            } catch (const std::exception& e) {
                taking->vm.resume();
                taking->handlers.on_failed(e.what());
                return;
            }
            taking->vm.resume();
            taking->resumed = Clock::now();
            finish(taking);
        },
        pause_patience);
}

} // namespace

void take_live_snapshot(Vm& vm, const SnapshotWriter& writer, const std::string& dir, LiveSnapshotHandlers handlers)
{
    auto taking = std::make_shared<Taking>(vm, std::move(handlers));
    try {
        taking->live = writer.begin_live(vm, dir);
    } catch (const std::exception& e) {
        taking->handlers.on_failed(e.what());
        return;
    }
    vm.in_background([taking] { taking->live->copy_running(taking->vm); },
                     [taking](std::exception_ptr failed) {
                         if (failed) {
                             taking->handlers.on_failed(what(failed));
                             return;
                         }
                         capture(taking);
                     });
}

} // namespace agentvm
