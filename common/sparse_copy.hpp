// Copying the written sectors of a disk overlay into a snapshot, and back into a restored
// VM's own overlay, without reading or allocating anything else.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace agentvm {

// Copies each byte range [offset, offset+length) of `from` to the same offsets in `to`, then
// makes `to` `size` bytes long. Returns the bytes copied. Throws Error naming `what`.
uint64_t copy_ranges(int from, int to, const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
                     uint64_t size, const std::string& what);

} // namespace agentvm
