// A snapshot's manifest.json (vmm/snapshot.hpp), decoded from the bytes read once: the format
// checked, and the VM's sizes range-checked before anything is sized by them. The manifest has
// no digest of its own: it is what the other files' digests are checked against. Pure (the
// host's limits come in as data), so tests/unit/test_snapshot_manifest.cpp drives it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include <nlohmann/json.hpp>

namespace agentvm {

// 2: the manifest records disk_bytes; 3: vsock reset_avail; 4: live snapshots over a parent;
// 5: vsock keeps only its CID (no connections, replies or reset event)
inline constexpr int snapshot_format = 5;

// A live snapshot's pages are mapped run by run by every restore: it stores few runs (merged
// across gaps of up to this many pages, then wider ones), and a restore refuses more.
inline constexpr uint64_t snapshot_page_gap = 16;
inline constexpr size_t max_snapshot_page_runs = 1024;
// How many snapshots deep a chain of live snapshots may go (each one a disk layer).
inline constexpr uint32_t max_snapshot_depth = 24;

// What a restored VM may be on this host (vmm/vm_limits.hpp; the disk: what a bake writes).
struct ManifestLimits {
    uint32_t max_vcpus = 0;
    uint64_t max_mem_mib = 0;
    uint64_t max_disk_bytes = 0;
};

// The snapshot a live snapshot stores its changes over: where it was, the SHA-256 of its
// manifest.json's bytes (which hold its files' digests, so the whole chain hangs on the
// leaf's manifest), and how deep the new one is (1: over a baked snapshot).
struct SnapshotParent {
    std::string dir;
    std::string manifest_digest;
    uint32_t depth = 0;
};

struct SnapshotManifest {
    nlohmann::json doc;  // the whole manifest: inputs, host CPU, files
    uint32_t vcpus = 0;
    uint64_t mem_mib = 0;
    std::optional<uint64_t> disk_bytes;  // recorded only with a root disk
    std::optional<SnapshotParent> parent;  // a live snapshot's
};

// Throws Error naming the problem (the caller adds which snapshot): not JSON, another format, or a field out of range (vcpus,
// mem_mib: 1 to the limit; disk_bytes: whole 512-byte sectors, 1 to the limit; parent: an
// absolute dir, a SHA-256 in hex, depth 1 to max_snapshot_depth).
SnapshotManifest decode_manifest(std::span<const uint8_t> bytes, const ManifestLimits& limits);

} // namespace agentvm
