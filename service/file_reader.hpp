// A file read out of a sandbox as the guest sends it (read_file's data events), whatever takes
// the bytes (a native download's body, another API's). Backpressure is the sandbox's own: a
// slow taker holds its output (Sandbox::hold_output, as StreamPacer does) until it drains.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "service/sandbox.hpp"

namespace agentvm {

struct FileReaderHandlers {
    std::function<void(std::string&& bytes)> on_data;
    // Once, after the last on_data: read_file's answer, or its {"error":{code,message}}.
    std::function<void(Json&& answer)> on_done;
};

// Starts reading `path` (as `user`, when given: the agent's "user"); returns the call's
// number (Sandbox::forget, for a taker that goes).
uint64_t read_file_stream(const std::shared_ptr<Sandbox>& sandbox, const std::string& path,
                          FileReaderHandlers handlers, const std::optional<std::string>& user = std::nullopt);

} // namespace agentvm
