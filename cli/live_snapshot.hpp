// The episode's "snapshot" op: pause the running VM, write what it holds as a live snapshot
// (vmm/snapshot.hpp), let it run on, and answer with where the snapshot is and what it cost.
#pragma once

#include <functional>
#include <string>

#include "protocol/agent_protocol.hpp"
#include "vmm/snapshot.hpp"
#include "vmm/vm.hpp"

namespace agentvm {

// On the VM's loop thread while it runs. `answer` gets, exactly once,
//   {"snapshot": {"path", "memory_bytes", "disk_bytes", "state_bytes", "pause_ms", "ms"}}
// (bytes of data stored; pause_ms: how long the vCPUs were parked) or
//   {"error": {"code": "snapshot_failed", "message"}}; the VM runs on either way.
void take_live_snapshot(Vm& vm, const SnapshotWriter& writer, const std::string& dir,
                        std::function<void(Json answer)> answer);

} // namespace agentvm
