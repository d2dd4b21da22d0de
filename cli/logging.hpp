// The CLI's logger: spdlog to stderr, one line per event, prefixed "agentvm:" so it reads
// apart from the guest console (which may share stderr).
#pragma once

#include <string>

namespace agentvm {

// Throws Error on an unknown level name.
void setup_logging(const std::string& level);

} // namespace agentvm
