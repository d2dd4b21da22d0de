// Numbers agentvm reads from flags, environment variables and wire formats: the whole text is
// decimal digits, nothing before or after, and the value fits the type. std::from_chars alone
// stops at the first non-digit and takes an empty text as an error only through its end
// pointer; every caller needs the same three checks, so they live here once.
#pragma once

#include <charconv>
#include <concepts>
#include <cstdint>
#include <optional>
#include <string_view>

namespace agentvm {

// `text` as a T when it is one or more decimal digits and nothing else (no sign, no blanks)
// and its value fits T; nullopt otherwise.
template <std::unsigned_integral T>
std::optional<T> whole_number(std::string_view text)
{
    T value = 0;
    const auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || err != std::errc() || end != text.data() + text.size())
        return std::nullopt;
    return value;
}

// `text` as a TCP or UDP port, 1 to 65535 (0 too when `zero_allowed`: "any port" to bind).
inline std::optional<uint16_t> port_number(std::string_view text, bool zero_allowed = false)
{
    const std::optional<uint32_t> value = whole_number<uint32_t>(text);
    if (!value || *value > 65535 || (*value == 0 && !zero_allowed))
        return std::nullopt;
    return static_cast<uint16_t>(*value);
}

} // namespace agentvm
