// A snapshot on disk: a directory holding
//   manifest.json  what it is: format, agentvm version, vCPUs, memory, disk size, the kernel and rootfs
//                  it was baked from, the host CPU's features, and each file's size, digest
//                  and stamp (vmm/file_digest.hpp);
//   state.cbor     the VM's state document (Vm::save_state) as CBOR;
//   memory         guest RAM, sparse: zero pages are holes;
//   disk           the sectors the guest had written to its root disk, sparse, at their offsets.
// A snapshot is written to a temporary directory beside the target and renamed into place,
// so a crashed bake leaves no half snapshot under the target's name.
//
// Loading checks everything before a VM exists, and names the first problem: a missing or
// truncated file, a digest that does not match (a flipped byte anywhere), another format
// version, another kernel or rootfs than recorded, a host CPU without features the snapshot's
// vCPUs were given. state.cbor is always hashed (it is small); memory and disk only when their
// stamp differs from the one recorded, i.e. when they were written or copied since the bake,
// since hashing hundreds of MiB on every restore would cost more than the restore itself.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "vmm/kvm.hpp"
#include "vmm/vm.hpp"
#include "vmm/vm_config.hpp"

namespace agentvm {

inline constexpr int snapshot_format = 3;  // 2: the manifest records disk_bytes; 3: vsock reset_avail

struct SnapshotSummary {
    std::string dir;
    uint64_t memory_data_bytes = 0;  // guest RAM actually stored (the rest are holes)
    uint64_t disk_data_bytes = 0;
    uint64_t state_bytes = 0;
};

// A snapshot to be written to `dir`, which must not exist yet. What the manifest records of the
// VM's inputs (kernel, rootfs, host CPU) is read when the writer is made, before the VM runs:
// once the VMM is jailed, the kernel and rootfs are out of its reach by name, and only
// parent_dir() is left writable. Throws Error; nothing is left behind then.
class SnapshotWriter {
public:
    SnapshotWriter(const Kvm& kvm, const VmConfig& config, const std::string& dir);
    // Where the snapshot is written and then renamed into place.
    std::string parent_dir() const { return target_.parent_path().string(); }
    // Writes the snapshot of `vm`, whose run() has returned.
    SnapshotSummary write(const Vm& vm) const;

private:
    std::filesystem::path target_;
    std::string dir_;
    nlohmann::json manifest_;
};

struct LoadedSnapshot {
    VmConfig config;      // the caller's, with the snapshot's vCPU count, memory and disk size
    VmSnapshotData data;
};

// Opens and checks the snapshot at `dir` for a VM configured as `config` (kernel, rootfs,
// console, ...). config.vcpus / mem_mib / disk_bytes, when not 0, must equal the snapshot's.
// Throws Error.
LoadedSnapshot load_snapshot(const Kvm& kvm, const std::string& dir, VmConfig config);

} // namespace agentvm
