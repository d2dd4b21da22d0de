#include "common/base64.hpp"

#include <nettle/base64.h>

#include <cstdint>

namespace agentvm {

std::string base64_encode(std::string_view bytes)
{
    std::string out(BASE64_ENCODE_RAW_LENGTH(bytes.size()), '\0');
    // SAFETY: char and uint8_t share size and representation; Nettle only reads the bytes.
    base64_encode_raw(out.data(), bytes.size(), reinterpret_cast<const uint8_t*>(bytes.data()));
    return out;
}

std::optional<std::string> base64_decode(std::string_view text)
{
    if (text.size() % 4 != 0)
        return std::nullopt;
    base64_decode_ctx ctx;
    base64_decode_init(&ctx);
    std::string out(BASE64_DECODE_LENGTH(text.size()), '\0');
    size_t length = out.size();
    // SAFETY: as above; out holds BASE64_DECODE_LENGTH(text.size()) bytes, as Nettle requires.
    if (!base64_decode_update(&ctx, &length, reinterpret_cast<uint8_t*>(out.data()), text.size(), text.data())
        || !base64_decode_final(&ctx))
        return std::nullopt;
    out.resize(length);
    // Nettle skips whitespace and ignores the bits padding leaves over; a text is canonical
    // only if it is exactly what encoding its bytes gives, so one value has one spelling.
    if (base64_encode(out) != text)
        return std::nullopt;
    return out;
}

} // namespace agentvm
