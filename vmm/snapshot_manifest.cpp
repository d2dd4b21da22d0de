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
        if (m.doc.contains("parent")) {
            const json& parent = m.doc.at("parent");
            SnapshotParent p;
            p.dir = parent.at("dir").get<std::string>();
            p.manifest_digest = parent.at("manifest_digest").get<std::string>();
            p.depth = static_cast<uint32_t>(count_field(parent, "depth", max_snapshot_depth));
            if (p.dir.empty() || p.dir.front() != '/')
                throw Error(fmt::format("manifest: parent dir {} is not an absolute path", parent.at("dir").dump()));
            if (p.manifest_digest.size() != 64 ||
                p.manifest_digest.find_first_not_of("0123456789abcdef") != std::string::npos)
                throw Error("manifest: parent manifest_digest is not a SHA-256 in hex");
            m.parent = std::move(p);
        }
    } catch (const json::exception& e) {
        throw Error(fmt::format("malformed manifest: {}", e.what()));
    }
    return m;
}

} // namespace agentvm
