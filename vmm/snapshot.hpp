// A snapshot on disk: a directory holding
//   manifest.json  what it is: format, agentvm version, vCPUs, memory, disk size, the kernel and rootfs
//                  it was baked from, the host CPU's features, and each file's size, digest
//                  and stamp (common/file_digest.hpp);
//   state.cbor     the VM's state document (Vm::save_state) as CBOR;
//   memory         guest RAM, sparse: zero pages are holes;
//   disk           the sectors the guest had written to its root disk, sparse, at their offsets.
// A snapshot is written to a temporary directory beside the target and renamed into place,
// so a crashed bake leaves no half snapshot under the target's name.
//
// A live snapshot (SnapshotWriter::begin_live) of a VM restored from a snapshot stores only
// what the VM changed since: memory holds the pages it has its own copies of, disk the
// sectors it wrote, both sparse at their offsets, and state.cbor's "layer" lists them (page
// runs, byte ranges); the manifest's "parent" names the snapshot below by directory and the
// SHA-256 of its manifest.json. A restore walks the chain down to the baked snapshot at its
// root and checks every link: a parent that is missing, or whose manifest is not the one
// recorded, is refused naming it. Of a booted VM, a live snapshot is whole, like a bake's.
//
// Loading checks everything before a VM exists, and names the first problem: a missing or
// truncated file, a digest that does not match, another format version, a size out of range
// (vmm/snapshot_manifest.hpp), another kernel or rootfs than recorded, a host CPU without
// features the snapshot's vCPUs were given.
//
// What a restore checks and what it trusts (SECURITY.md, "A malformed or tampered snapshot"):
// - manifest.json and state.cbor are read once into memory, and what is checked is what is
//   used: state.cbor's digest is taken of the bytes that are then decoded, on every restore.
//   The manifest is the root the digests hang on; it has no digest of its own.
// - memory and disk are hashed only when their stamp differs from the one the manifest records
//   (device, inode, size, mtime, ctime): a copy has another inode, and a write in place moves
//   ctime, which only the kernel sets (to the current time), so it cannot be put back. With the stamp
//   unchanged their content is trusted unread, since hashing hundreds of MiB would cost more than
//   the restore. A change the stamp does not show goes unnoticed: one beneath the filesystem
//   (media corruption, writes to the block device), or a write within the same timestamp tick
//   (a few ms) as the bake's own last one. Even a full hash would not pin memory: it is mapped
//   MAP_PRIVATE and read as the guest touches it, so a write to the file while clones run shows
//   in the pages they have not touched yet.
// The digests catch accidents (a truncated or bit-flipped copy, a file from another snapshot).
// They do not stop whoever can write the snapshot directory, who can rewrite the manifest's
// digests and stamps too: the directory must be writable by its owner only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "vmm/kvm.hpp"
#include "vmm/partial_dir.hpp"
#include "vmm/snapshot_manifest.hpp"
#include "vmm/vm.hpp"
#include "vmm/vm_config.hpp"

namespace agentvm {

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
// What live snapshots of a restored VM continue from: the snapshot it was restored from (their
// parent), and what that snapshot's manifest records of the VM's inputs (kernel, rootfs, host
// CPU), which the restore checked, so that they need not be read again.
struct SnapshotOrigin {
    SnapshotParent parent;
    nlohmann::json inputs;
};

class LiveSnapshot;

class SnapshotWriter {
public:
    SnapshotWriter(const Kvm& kvm, const VmConfig& config, const std::string& dir);
    // For live snapshots into directories named later (write_live): of a VM restored from
    // `origin`, or booted (none: its inputs are read now).
    SnapshotWriter(const Kvm& kvm, const VmConfig& config, std::optional<SnapshotOrigin> origin);
    // Where the snapshot is written and then renamed into place.
    std::string parent_dir() const { return target_.parent_path().string(); }
    // Writes the snapshot of `vm`, whose run() has returned.
    SnapshotSummary write(const Vm& vm) const;
    // Starts a live snapshot of `vm`, running (on its loop's thread), into `dir`, which must
    // not exist. Throws Error; nothing is left behind then.
    std::unique_ptr<LiveSnapshot> begin_live(Vm& vm, const std::string& dir) const;

private:
    std::filesystem::path target_;
    std::string dir_;
    nlohmann::json manifest_;
    std::optional<SnapshotParent> origin_;  // the parent of every live snapshot
};

// A live snapshot being taken, in the order its steps run; each throws Error. Dropped before
// finish() has returned, it removes what it wrote. Of a restored VM it copies most of what it
// stores while the VM runs (vmm/live_copy.hpp); of a booted one, everything while it is paused.
class LiveSnapshot {
public:
    ~LiveSnapshot();
    LiveSnapshot(const LiveSnapshot&) = delete;
    LiveSnapshot& operator=(const LiveSnapshot&) = delete;

    // On the VM's worker thread (Vm::in_background), the VM running.
    void copy_running(const Vm& vm);
    // On the loop's thread, the VM paused (Vm::pause): what it wrote since, and its state. The
    // VM may run on once this returns.
    void capture(Vm& vm);
    // On the worker thread, the VM running again: the state encoded, the files synced and
    // hashed, the manifest written, the snapshot renamed into place.
    SnapshotSummary finish();
    // Bytes of memory and disk copied while the VM ran, and while it was paused.
    uint64_t running_bytes() const { return copy_.running_bytes; }
    uint64_t paused_bytes() const { return copy_.paused_bytes; }
    // Whether the pages the VM wrote during the copy were told apart (core/soft_dirty.hpp).
    bool tracked() const { return copy_.pages_tracked; }

private:
    friend class SnapshotWriter;
    LiveSnapshot() = default;

    std::optional<PartialDir> partial_;  // removed unless renamed into place
    std::filesystem::path target_;
    nlohmann::json manifest_;
    std::optional<SnapshotParent> origin_;  // a layered snapshot's parent
    Fd memory_;
    Fd disk_;
    ByteRanges disk_to_copy_;
    LiveCopy copy_;
    nlohmann::json state_;
};

struct LoadedSnapshot {
    VmConfig config;      // the caller's, with the snapshot's vCPU count, memory and disk size
    VmSnapshotData data;
    // What live snapshots of the restored VM continue from: this snapshot.
    SnapshotOrigin origin;
};

// Opens and checks the snapshot at `dir` for a VM configured as `config` (kernel, rootfs,
// console, ...). config.vcpus / mem_mib / disk_bytes, when not 0, must equal the snapshot's.
// Throws Error.
LoadedSnapshot load_snapshot(const Kvm& kvm, const std::string& dir, VmConfig config);

} // namespace agentvm
