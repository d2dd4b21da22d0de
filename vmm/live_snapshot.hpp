// A live snapshot of a running VM (vmm/snapshot.hpp) in its order: most of it copied while
// the VM runs, on the VM's worker thread; then the VM paused briefly for what it wrote since
// and its state; then, the VM running again, the files finished on the worker.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "vmm/snapshot.hpp"
#include "vmm/vm.hpp"

namespace agentvm {

struct LiveSnapshotTaken {
    SnapshotSummary summary;
    uint64_t copied_running_bytes = 0;  // memory and disk copied while the VM ran
    uint64_t copied_paused_bytes = 0;   // and while it was paused
    // Whether the pages written during the copy were told apart; else the pause copied them
    // all again.
    bool tracked = false;
    double pause_ms = 0;  // from asking the vCPUs to park to resuming them
    double ms = 0;        // the whole snapshot
};

struct LiveSnapshotHandlers {
    std::function<void(const LiveSnapshotTaken&)> on_taken;
    std::function<void(const std::string& why)> on_failed;
};

// On the VM's loop thread while it runs; exactly one handler is called later, on that thread.
// The VM runs on either way.
void take_live_snapshot(Vm& vm, const SnapshotWriter& writer, const std::string& dir, LiveSnapshotHandlers handlers);

} // namespace agentvm
