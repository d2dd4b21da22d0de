// The run_code call: one persistent python3 per agent (per sandbox), driven by
// interpreter_driver.py, so variables, imports and open files carry over from cell to cell as
// in a notebook kernel. Cells take turns, like shell calls.
//
// Each cell is sent as one JSON line on the interpreter's stdin; its output goes to FIFOs made
// for it (as a shell call's), and its value and exception come back as one JSON line on the
// status FIFO. A timeout interrupts the cell (SIGINT: KeyboardInterrupt) and kills the
// interpreter if the cell has not ended interrupt_grace later; then, and when the interpreter
// dies under a cell, the next cell starts a fresh one (state_lost).
#pragma once

#include <chrono>

#include "guest/agent/outbox.hpp"
#include "guest/agent/session_process.hpp"
#include "protocol/agent_protocol.hpp"

namespace agentvm {

class Interpreter {
public:
    static constexpr std::chrono::seconds interrupt_grace{2};
    // A cell's result is cut to this (and to its max_output).
    static constexpr uint64_t max_result_bytes = uint64_t{1} << 20;

    // Returns the final response. Throws CallError(spawn_failed, not_found) when python3
    // cannot start.
    Json run(const Json& id, const RunCodeRequest& request, Outbox& outbox, int cancel_fd);
    // The response of a cell cancelled before its turn: it never ran, the interpreter is
    // untouched.
    static Json not_run(const Json& id);

    // From any thread, as the agent exits (SessionProcess::kill_on_exit).
    void kill_on_exit() const { python_.kill_on_exit(); }

private:
    SessionProcess python_{"interp"};
};

} // namespace agentvm
