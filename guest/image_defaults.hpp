// What a template (templates/, `agentvm template build`) sets for every tool call of its
// image: the environment and working directory its OCI config or --env/--workdir named, in
// the files protocol/image_defaults.hpp describes, read once by init at boot (the user file
// is the agent's: guest/agent/run_as.hpp). The image is the user's: a malformed entry is
// skipped with a console line, never fatal.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "protocol/image_defaults.hpp"

namespace agentvm {

struct EnvEntries {
    std::vector<std::pair<std::string, std::string>> entries;
    std::vector<std::string> rejected;  // why each skipped entry was skipped
};

// Splits NUL-ended KEY=VALUE entries. A key must be non-empty, hold no '=', and the entry must
// be NUL-ended (a missing last NUL means a cut file: that entry is rejected).
EnvEntries parse_image_env(std::string_view text);

// The working directory from the workdir file's text, or "" when it is not an absolute path
// without NUL bytes.
std::string parse_image_workdir(std::string_view text);

// Reads both files (absent files: no defaults), sets the environment variables in this process
// (init, whose environment every tool call inherits) and returns the working directory ("" for
// none). Says on the console what it skipped.
std::string apply_image_defaults();

} // namespace agentvm
