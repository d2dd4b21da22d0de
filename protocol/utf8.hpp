// UTF-8 validation: decides whether bytes travel as a JSON string or as base64.
#pragma once

#include <string_view>

namespace agentvm {

// Strict RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF.
bool is_valid_utf8(std::string_view bytes);

} // namespace agentvm
