#include "vmm/snapshot_manifest.hpp"

#include <fmt/format.h>

#include "common/error.hpp"
#include "devices/cow_disk.hpp"

namespace agentvm {
namespace {

using nlohmann::json;

// An integer field from 1 to `max`. nlohmann's get<uint32_t>() would wrap a larger value, a
// negative one or a fraction into range, so the JSON type is checked first.
uint64_t count_field(const json& manifest, const char* field, uint64_t max)
{
    const json& value = manifest.at(field);
    if (!value.is_number_unsigned() || value.get<uint64_t>() == 0 || value.get<uint64_t>() > max)
        throw Error(fmt::format("manifest: {} {} is out of range: 1 to {} on this host", field,
                                value.dump(), max));
    return value.get<uint64_t>();
}

} // namespace

SnapshotManifest decode_manifest(std::span<const uint8_t> bytes, const ManifestLimits& limits)
{
    SnapshotManifest m;
    try {
        m.doc = json::parse(bytes.begin(), bytes.end());
        const json& format = m.doc.at("format");
        if (format != snapshot_format)
            throw Error(fmt::format("manifest: format {}; this agentvm reads format {} only: rebake it",
                                    format.dump(), snapshot_format));
        m.vcpus = static_cast<uint32_t>(count_field(m.doc, "vcpus", limits.max_vcpus));
        m.mem_mib = count_field(m.doc, "mem_mib", limits.max_mem_mib);
        if (m.doc.contains("disk_bytes")) {
            m.disk_bytes = count_field(m.doc, "disk_bytes", limits.max_disk_bytes);
            if (*m.disk_bytes % CowDisk::sector_size != 0)
                throw Error(fmt::format("manifest: disk_bytes {} is not a whole number of {}-byte sectors",
                                        *m.disk_bytes, CowDisk::sector_size));
        }
    } catch (const json::exception& e) {
        throw Error(fmt::format("malformed manifest: {}", e.what()));
    }
    return m;
}

} // namespace agentvm
