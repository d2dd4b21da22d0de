#include "cli/port_forward/handshake.hpp"

#include <fmt/format.h>

namespace agentvm {

std::string printable(std::string_view text, size_t limit)
{
    std::string out;
    for (size_t i = 0; i < text.size() && i < limit; ++i) {
        const auto byte = static_cast<unsigned char>(text[i]);
        if (byte >= 0x20 && byte < 0x7f && byte != '\\')
            out += static_cast<char>(byte);
        else
            out += fmt::format("\\x{:02x}", byte);
    }
    if (text.size() > limit)
        out += "...";
    return out;
}

} // namespace agentvm
