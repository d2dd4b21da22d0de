// POST /run_jupyter, compatible with SandboxFusion (docs/api.md, "SandboxFusion: POST
// /run_jupyter"): a fresh sandbox per request whose persistent interpreter (the agent's
// run_code) runs the cells in order, stopping at the first error, within a time per cell and
// a time for all; each cell answered as a notebook shows it (stdout, stderr, display, error).
#pragma once

#include <memory>

#include "service/http_server.hpp"
#include "service/sandbox_manager.hpp"

namespace agentvm {

void run_jupyter(SandboxManager& manager, const std::shared_ptr<HttpExchange>& exchange);

} // namespace agentvm
