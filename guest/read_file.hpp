// Reading a small file whole in the guest's init: the kernel command line, a template's
// defaults.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace agentvm {

// The file's bytes, or nullopt with errno set: the open's or read's error, or EFBIG when it
// holds more than max_bytes. A symlink at `path` is not followed (ELOOP).
std::optional<std::string> read_small_file(const char* path, size_t max_bytes);

} // namespace agentvm
