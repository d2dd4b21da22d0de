#include "protocol/utf8.hpp"

#include <cstdint>

namespace agentvm {

bool is_valid_utf8(std::string_view bytes)
{
    size_t i = 0;
    const size_t n = bytes.size();
    while (i < n) {
        const uint8_t c = static_cast<uint8_t>(bytes[i]);
        if (c < 0x80) {
            ++i;
            continue;
        }
        size_t len = 0;
        // Bounds of the second byte exclude overlongs (E0, F0), surrogates (ED) and
        // code points above U+10FFFF (F4), per RFC 3629's table.
        uint8_t lo = 0x80, hi = 0xbf;
        if (c >= 0xc2 && c <= 0xdf) {
            len = 2;
        } else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            if (c == 0xe0)
                lo = 0xa0;
            else if (c == 0xed)
                hi = 0x9f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
            if (c == 0xf0)
                lo = 0x90;
            else if (c == 0xf4)
                hi = 0x8f;
        } else {
            return false;
        }
        if (n - i < len)
            return false;
        const uint8_t second = static_cast<uint8_t>(bytes[i + 1]);
        if (second < lo || second > hi)
            return false;
        for (size_t k = 2; k < len; ++k) {
            const uint8_t b = static_cast<uint8_t>(bytes[i + k]);
            if (b < 0x80 || b > 0xbf)
                return false;
        }
        i += len;
    }
    return true;
}

} // namespace agentvm
