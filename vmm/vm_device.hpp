// One row of the VM's device table (Vm::devices_): what saving, restoring, a pause and the
// VM's teardown do with a device, so that each of those loops over the table instead of
// naming every device. Rows are made as the devices are added, in boot order; an empty
// function means the device has nothing to do at that step.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/fd.hpp"
#include "vmm/live_copy.hpp"

namespace agentvm {

class VirtioSlot;

// The files a snapshot's devices are restored from besides the state document: the disk's
// written sectors, one file or (a live snapshot's chain) one per snapshot, lowest first.
struct SnapshotFiles {
    Fd disk;
    std::vector<std::pair<Fd, ByteRanges>> disk_layers;
};

struct VmDevice {
    std::string key;   // its part of the state document
    std::string name;  // for people: "the disk"
    std::function<nlohmann::json()> save;
    // Decodes and checks its part of the state document, touching nothing; the returned step
    // restores the device (each device before its transport). No step runs until every part
    // has been decoded.
    std::function<std::function<void()>(const nlohmann::json& part, SnapshotFiles& files)> decode;
    // After KVM's state is back, as the restored VM is about to run.
    std::function<void()> restored;
    // A pause: the virtio slot whose pending queue notifications it takes once the vCPUs are
    // parked, and whether the device still has requests in flight, which it waits out.
    VirtioSlot* slot = nullptr;
    std::function<bool()> busy;
    // Teardown: before the vCPU threads are joined (one may wait in the device); once they
    // are, before the loop drains (ending I/O that would keep it waiting); after it drained.
    std::function<void()> release_vcpus;
    std::function<void()> quiesce;
    std::function<void()> finish;
};

} // namespace agentvm
