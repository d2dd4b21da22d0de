// A template's own blocks: what its build changed in the base image it shares with every
// template of the same source. The template stores only these, in a sparse layer file of the
// disk's size, and boots as base + layer (VmConfig::rootfs_layer, devices/cow_disk.hpp): N
// templates of one base cost one base and N small layers on any filesystem, reflinks or not.
#pragma once

#include <cstdint>
#include <filesystem>
#include <utility>
#include <vector>

namespace agentvm {

// The comparison's unit: the images' ext4 block.
inline constexpr uint64_t delta_block_bytes = 4096;

struct ImageDelta {
    // [offset, offset+length) of the image that differ from the base, in order, merged, in
    // whole blocks.
    std::vector<std::pair<uint64_t, uint64_t>> byte_ranges;
    uint64_t bytes = 0;  // their total length
};

// Compares `image` with `base` (both files of one size) block by block wherever either holds
// data, and writes the blocks that differ into a new file `layer` of the same size at their
// own offsets, leaving the rest a hole. Throws Error.
ImageDelta write_image_delta(const std::filesystem::path& base, const std::filesystem::path& image,
                             const std::filesystem::path& layer);

// The ranges kept beside the layer (rootfs.layer.ranges: [[offset, length], ...]; apart from
// template.json, which `template list` reads for every template, since a fragmented image's
// delta can run to many thousands). Writing replaces the file in one rename. Reading throws
// Error unless the file is that list, in order, apart, of whole sectors inside disk_bytes.
void write_ranges_file(const std::filesystem::path& path, const std::vector<std::pair<uint64_t, uint64_t>>& ranges);
std::vector<std::pair<uint64_t, uint64_t>> read_ranges_file(const std::filesystem::path& path, uint64_t disk_bytes);

} // namespace agentvm
