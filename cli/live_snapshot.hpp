// The episode's "snapshot" op: write what the running VM holds as a live snapshot
// (vmm/snapshot.hpp), copying most of it while the VM runs and the rest with it briefly
// paused, and answer with where the snapshot is and what it cost.
#pragma once

#include <functional>
#include <string>

#include "protocol/agent_protocol.hpp"
#include "vmm/snapshot.hpp"
#include "vmm/vm.hpp"

namespace agentvm {

// On the VM's loop thread while it runs; the answer comes later on that thread. `answer` gets,
// exactly once,
//   {"snapshot": {"path", "memory_bytes", "disk_bytes", "state_bytes", "copied_running_bytes",
//                 "copied_paused_bytes", "tracked", "pause_ms", "ms"}}
// (bytes of data stored; bytes copied while the VM ran and while it was paused; whether the
// pages written during the copy were told apart, else the pause copied them all again;
// pause_ms: from asking the vCPUs to park to resuming them) or
//   {"error": {"code": "snapshot_failed", "message"}}; the VM runs on either way.
void take_live_snapshot(Vm& vm, const SnapshotWriter& writer, const std::string& dir,
                        std::function<void(Json answer)> answer);

} // namespace agentvm
