// A word for sh and bash, quoted so that it stays literal: the guest agent's commands for its
// shell and the relay's env export both build shell lines from untrusted text.
#pragma once

#include <string>
#include <string_view>

namespace agentvm {

// Single quotes: everything literal, a ' written as '\''.
inline std::string shell_quote(std::string_view text)
{
    std::string quoted = "'";
    for (char c : text) {
        if (c == '\'')
            quoted += "'\\''";
        else
            quoted += c;
    }
    return quoted + "'";
}

} // namespace agentvm
