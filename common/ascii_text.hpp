// ASCII text helpers for the wire formats agentvm reads (HTTP heads, host names, rules), where
// case and blanks are ASCII's whatever the locale.
#pragma once

#include <string>
#include <string_view>

namespace agentvm {

inline char ascii_lower(char c)
{
    return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

inline std::string ascii_lower(std::string_view text)
{
    std::string out(text);
    for (char& c : out)
        c = ascii_lower(c);
    return out;
}

// `text` without the spaces and tabs around it (HTTP's optional whitespace, RFC 9110 5.6.3).
inline std::string_view trim_blanks(std::string_view text)
{
    while (!text.empty() && (text.front() == ' ' || text.front() == '\t'))
        text.remove_prefix(1);
    while (!text.empty() && (text.back() == ' ' || text.back() == '\t'))
        text.remove_suffix(1);
    return text;
}

} // namespace agentvm
