// agentvm serve: the per-host sandbox service (docs/api.md), run until SIGINT, SIGTERM or
// SIGHUP.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "service/listen_spec.hpp"

namespace agentvm {

struct ServeConfig {
    std::vector<ListenSpec> listen;
    std::optional<std::string> token;  // every request must carry it when set
};

// Returns the exit status: 0 after a stop signal.
int run_serve(const ServeConfig& config);

} // namespace agentvm
