// The run_code call in a Python context (contexts.hpp): one persistent python3, driven by
// interpreter_driver.py, so variables, imports and open files carry over from cell to cell as
// in a notebook kernel. Cells take turns, like shell calls.
//
// Each cell is sent as one JSON line on the interpreter's stdin; its output goes to FIFOs made
// for it (as a shell call's), and its value (repr and rich forms) and exception come back as
// one JSON line on the status FIFO, after a line for each display() the cell made, which goes
// on to the client as a display event. A timeout interrupts the cell (SIGINT:
// KeyboardInterrupt) and kills the interpreter if the cell has not ended interrupt_grace later;
// then, and when the interpreter dies under a cell, the next cell starts a fresh one
// (state_lost).
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

#include "guest/agent/outbox.hpp"
#include "guest/agent/session_process.hpp"
#include "protocol/agent_protocol.hpp"

namespace agentvm {

class Interpreter {
public:
    static constexpr std::chrono::seconds interrupt_grace{2};
    // A cell's result is cut to this (and to its max_output); a rich form over it (or over the
    // max_output) is dropped.
    static constexpr uint64_t max_result_bytes = uint64_t{1} << 20;
    // A value's rich forms together, as JSON text: a form past it is dropped. Part of the
    // budget max_response_line_for (protocol/response_line.hpp) gives the fields beside the output.
    static constexpr uint64_t max_forms_bytes = uint64_t{4} << 20;
    // Display events of one cell, in number and in bytes all together: they wait in the
    // connection's outbox, like streamed output, until the client reads them.
    static constexpr uint64_t max_displays = 256;
    static constexpr size_t max_display_bytes = size_t{32} << 20;

    // `cwd`: where the interpreter starts; absent, the agent's.
    explicit Interpreter(std::optional<std::string> cwd = std::nullopt) : cwd_(std::move(cwd)) {}

    // Returns the final response. Throws CallError(spawn_failed, not_found) when python3
    // cannot start.
    Json run(const Json& id, const RunCodeRequest& request, Outbox& outbox, int cancel_fd);
    // The response of a cell cancelled before its turn: it never ran, the interpreter is
    // untouched.
    static Json not_run(const Json& id);

    // Whether the interpreter runs (it has not died since its last cell), and ending it; not
    // while a cell runs.
    bool running() { return python_.running(); }
    void stop() { python_.stop(); }

    // From any thread, as the agent exits (SessionProcess::kill_on_exit); also how a restart
    // ends a running cell.
    void kill_on_exit() const { python_.kill_on_exit(); }
    // Its python3's pid while it runs, else -1; from any thread.
    pid_t pid() const { return python_.group(); }

private:
    std::optional<std::string> cwd_;
    SessionProcess python_{"interp"};
};

} // namespace agentvm
