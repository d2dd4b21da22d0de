// A snapshot's manifest.json (vmm/snapshot.hpp), decoded from the bytes read once: the format
// checked, and the VM's sizes range-checked before anything is sized by them. The manifest has
// no digest of its own: it is what the other files' digests are checked against. Pure (the
// host's limits come in as data), so tests/unit/test_snapshot_manifest.cpp drives it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include <nlohmann/json.hpp>

namespace agentvm {

inline constexpr int snapshot_format = 3;  // 2: the manifest records disk_bytes; 3: vsock reset_avail

// What a restored VM may be on this host (vmm/vm_limits.hpp; the disk: what a bake writes).
struct ManifestLimits {
    uint32_t max_vcpus = 0;
    uint64_t max_mem_mib = 0;
    uint64_t max_disk_bytes = 0;
};

struct SnapshotManifest {
    nlohmann::json doc;  // the whole manifest: inputs, host CPU, files
    uint32_t vcpus = 0;
    uint64_t mem_mib = 0;
    std::optional<uint64_t> disk_bytes;  // recorded only with a root disk
};

// Throws Error naming the problem (the caller adds which snapshot): not JSON, another format, or a field out of range (vcpus,
// mem_mib: 1 to the limit; disk_bytes: whole 512-byte sectors, 1 to the limit).
SnapshotManifest decode_manifest(std::span<const uint8_t> bytes, const ManifestLimits& limits);

} // namespace agentvm
