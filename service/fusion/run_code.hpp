// POST /run_code, compatible with SandboxFusion (docs/api.md, "SandboxFusion"): a fresh
// sandbox from the default pool per request, the code written to a file in a work directory
// with the request's files beside it, run with the request's stdin and time and memory
// limits, the wanted files fetched, the sandbox deleted. Answered as SandboxFusion answers:
// 200 with status Success, Failed or SandboxError, unless serve refuses the request itself
// (a malformed body: 400; at capacity: 429 or 503 with Retry-After).
#pragma once

#include <memory>

#include "service/http_server.hpp"
#include "service/sandbox_manager.hpp"

namespace agentvm {

void run_code(SandboxManager& manager, const std::shared_ptr<HttpExchange>& exchange);

} // namespace agentvm
