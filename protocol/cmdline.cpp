#include "protocol/cmdline.hpp"

#include <cstdint>

namespace agentvm {

namespace {

struct Param {
    std::string_view name;
    std::string_view value;
    bool has_value = false;
};

// The kernel's isspace() on a command line: ASCII whitespace.
bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

// Takes one word off the front of `rest` (which starts at a non-space). Follows next_arg():
// a quote opening the word or the value is dropped, and so is a quote ending the word.
Param next_param(std::string_view& rest)
{
    bool quoted = rest.front() == '"';
    if (quoted)
        rest.remove_prefix(1);

    bool in_quote = quoted;
    size_t end = 0;
    size_t equals = std::string_view::npos;
    for (; end < rest.size(); ++end) {
        char c = rest[end];
        if (is_space(c) && !in_quote)
            break;
        if (c == '=' && equals == std::string_view::npos)
            equals = end;
        if (c == '"')
            in_quote = !in_quote;
    }
    std::string_view word = rest.substr(0, end);
    rest.remove_prefix(end);

    Param param{word, {}, equals != std::string_view::npos};
    bool strip_closing_quote = quoted;
    if (param.has_value) {
        param.name = word.substr(0, equals);
        param.value = word.substr(equals + 1);
        if (!param.value.empty() && param.value.front() == '"') {
            param.value.remove_prefix(1);
            strip_closing_quote = true;
        }
    }
    std::string_view& last = param.has_value ? param.value : param.name;
    if (strip_closing_quote && !last.empty() && last.back() == '"')
        last.remove_suffix(1);
    return param;
}

bool names_equal(std::string_view a, std::string_view b)
{
    if (a.size() != b.size())
        return false;
    for (size_t i = 0; i < a.size(); ++i) {
        char x = a[i] == '-' ? '_' : a[i];
        char y = b[i] == '-' ? '_' : b[i];
        if (x != y)
            return false;
    }
    return true;
}

} // namespace

std::optional<std::string> find_cmdline_param(std::string_view cmdline, std::string_view name)
{
    std::optional<std::string> found;
    std::string_view rest = cmdline;
    for (;;) {
        while (!rest.empty() && is_space(rest.front()))
            rest.remove_prefix(1);
        if (rest.empty())
            break;
        Param param = next_param(rest);
        if (!param.has_value && param.name == "--")
            break;
        if (names_equal(param.name, name))
            found = std::string(param.value);
    }
    return found;
}

std::optional<uint32_t> parse_pids_max(std::string_view value)
{
    // Eight digits or more are over the limit anyway, and could overflow n.
    if (value.empty() || value.size() > 7)
        return std::nullopt;
    uint32_t n = 0;
    for (char c : value) {
        if (c < '0' || c > '9')
            return std::nullopt;
        n = n * 10 + static_cast<uint32_t>(c - '0');
    }
    if (n == 0 || n > max_pids_max)
        return std::nullopt;
    return n;
}


} // namespace agentvm
