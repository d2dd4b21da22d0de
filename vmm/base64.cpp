#include "vmm/base64.hpp"

#include <array>
#include <cstdint>

namespace agentvm {

namespace {

constexpr char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<int8_t, 256> make_decode_table()
{
    std::array<int8_t, 256> table{};
    table.fill(-1);
    for (int i = 0; i < 64; ++i)
        table[static_cast<uint8_t>(alphabet[i])] = static_cast<int8_t>(i);
    return table;
}

constexpr std::array<int8_t, 256> decode_table = make_decode_table();

} // namespace

std::string base64_encode(std::string_view bytes)
{
    std::string out;
    out.reserve((bytes.size() + 2) / 3 * 4);
    size_t i = 0;
    for (; i + 3 <= bytes.size(); i += 3) {
        const uint32_t v = static_cast<uint32_t>(static_cast<uint8_t>(bytes[i]) << 16)
            | static_cast<uint32_t>(static_cast<uint8_t>(bytes[i + 1]) << 8)
            | static_cast<uint8_t>(bytes[i + 2]);
        out += alphabet[v >> 18];
        out += alphabet[(v >> 12) & 63];
        out += alphabet[(v >> 6) & 63];
        out += alphabet[v & 63];
    }
    const size_t rest = bytes.size() - i;
    if (rest > 0) {
        uint32_t v = static_cast<uint32_t>(static_cast<uint8_t>(bytes[i]) << 16);
        if (rest == 2)
            v |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[i + 1]) << 8);
        out += alphabet[v >> 18];
        out += alphabet[(v >> 12) & 63];
        out += rest == 2 ? alphabet[(v >> 6) & 63] : '=';
        out += '=';
    }
    return out;
}

std::optional<std::string> base64_decode(std::string_view text)
{
    if (text.size() % 4 != 0)
        return std::nullopt;
    std::string out;
    out.reserve(text.size() / 4 * 3);
    for (size_t i = 0; i < text.size(); i += 4) {
        const bool last = i + 4 == text.size();
        const size_t pad = last ? (text[i + 3] == '=') + (text[i + 2] == '=') : 0;
        if (pad == 1 && text[i + 2] == '=')
            return std::nullopt; // "x=y=" style padding in the middle of a quantum
        uint32_t v = 0;
        for (size_t k = 0; k < 4 - pad; ++k) {
            const int8_t d = decode_table[static_cast<uint8_t>(text[i + k])];
            if (d < 0)
                return std::nullopt;
            v |= static_cast<uint32_t>(d) << (18 - 6 * k);
        }
        out += static_cast<char>(v >> 16);
        if (pad < 2)
            out += static_cast<char>((v >> 8) & 0xff);
        if (pad < 1)
            out += static_cast<char>(v & 0xff);
    }
    return out;
}

} // namespace agentvm
