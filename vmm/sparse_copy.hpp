// Copying a sparse file's data (the disk overlay into a snapshot, and back into a restored
// VM's own overlay) without reading or allocating its holes.
#pragma once

#include <cstdint>
#include <string>

namespace agentvm {

// Copies every data extent of `from` to the same offsets in `to` (in the kernel, with
// copy_file_range), then sizes `to` like `from`. Returns the bytes copied. Throws Error
// naming `what`.
uint64_t copy_data_extents(int from, int to, const std::string& what);

} // namespace agentvm
