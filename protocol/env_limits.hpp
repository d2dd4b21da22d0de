// A sandbox's env, wherever it is given (the episode relay's env op, docs/protocol.md; serve's
// create request, docs/api.md): the same bounds and names on both, so that what serve takes
// the relay never refuses.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string_view>

namespace agentvm {

inline constexpr size_t max_env_entries = 256;
inline constexpr size_t max_env_name_bytes = 256;

// A name a shell can export: letters, digits and _, not a digit first.
inline bool is_env_name(std::string_view name)
{
    if (name.empty() || name.size() > max_env_name_bytes || (name[0] >= '0' && name[0] <= '9'))
        return false;
    return std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    });
}

} // namespace agentvm
