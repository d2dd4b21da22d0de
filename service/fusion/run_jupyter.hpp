// POST /run_jupyter, compatible with SandboxFusion (docs/api.md, "SandboxFusion: POST
// /run_jupyter"): a fresh sandbox per request whose persistent interpreter (the agent's
// run_code) runs the cells in order, stopping at the first error, within a time per cell and
// a time for all; each cell answered as a notebook shows it (stdout, stderr, display, error).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "service/http_server.hpp"
#include "service/sandbox_manager.hpp"

namespace agentvm {

// What a cell keeps of its result's repr and of its exception's type, message and
// traceback: the agent's own bounds (guest/agent/interpreter.hpp, interpreter_driver.py),
// kept again here, where the guest's answer is not trusted.
inline constexpr uint64_t jupyter_result_kept = uint64_t{1} << 20;
inline constexpr size_t jupyter_exception_text_kept = size_t{64} << 10;

// A cell of the answer (stdout, stderr, display, error) from the agent's run_code answer,
// each output stream and the result cut to `max_output` bytes, what the cell asked for.
Json jupyter_cell_result(const Json& answer, uint64_t max_output);

void run_jupyter(SandboxManager& manager, const std::shared_ptr<HttpExchange>& exchange);

} // namespace agentvm
