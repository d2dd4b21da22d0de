// Standard base64 (RFC 4648 section 4, with padding): how the protocol carries bytes that
// are not valid UTF-8.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace agentvm {

std::string base64_encode(std::string_view bytes);
// nullopt unless `text` is canonical padded base64: no whitespace, padding where and only
// where needed, zero bits after the last byte. Nettle does the coding.
std::optional<std::string> base64_decode(std::string_view text);

} // namespace agentvm
