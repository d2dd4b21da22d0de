// The code interpreter's wire (docs/e2b.md, "Code interpreter"), as @e2b/code-interpreter reads
// it, kept apart from the mapping (interpreter_api.cpp) so that a new SDK touches this file:
// - the bodies of POST /execute {code, context_id?, language?, env_vars?} and POST /contexts
//   {language?, cwd?}, and the Context objects {id, language, cwd} answered;
// - /execute's answer, newline-delimited JSON, one object a line and never a blank one:
//   {"type":"stdout"|"stderr","text","timestamp"}, {"type":"result","is_main_result",
//   "text"?,"html"?,...} for a display and for the cell's value, {"type":"error","name",
//   "value","traceback"}, {"type":"number_of_executions","execution_count"} and last
//   {"type":"end_of_execution"}; each made here from the agent's run_code events and answer
//   (docs/protocol.md, "run_code").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/agent_protocol.hpp"

namespace agentvm {

// The agent's language for one of E2B's names (any case, as E2B's server takes them):
// "python" or "bash"; nullopt for a language agentvm does not run (js, r, java, ...).
std::optional<std::string> agent_language(std::string_view e2b_language);
// What the error for such a language says.
std::string unsupported_language_message(std::string_view e2b_language);

struct ExecuteRequest {
    std::string code;
    std::optional<std::string> context;   // context_id
    std::optional<std::string> language;  // the agent's
    std::optional<std::string> unsupported_language;  // as given, when agentvm runs no such cells
    std::optional<Json> env;              // env_vars: an object of strings
};
// Throws RefusedRequest (bad_field, missing_field) for a body the SDK would never send.
ExecuteRequest parse_execute_request(const Json& body);

struct ContextRequest {
    std::optional<std::string> language;  // the agent's
    std::optional<std::string> cwd;
};
// Throws RefusedRequest: a language agentvm does not run is refused here (bad_field).
ContextRequest parse_context_request(const Json& body);
// The agent's {"context","language","cwd",...} (create_context's answer, an entry of
// list_contexts') as E2B's Context {id, language, cwd}.
Json context_json(const Json& agent_context);

// UTF-8 text from output that comes in pieces cut anywhere (the agent's 64 KiB events): a
// character cut at a piece's end is held for the next piece. Bytes that are not UTF-8 pass on
// and become U+FFFD when the line is written (ndjson_line).
class Utf8Carry {
public:
    std::string take(std::string_view bytes);
    std::string flush() { return std::exchange(held_, std::string()); }

private:
    std::string held_;
};

// One execution's lines from the agent's run_code stream.
class ExecutionLines {
public:
    // The lines for an event: a stdout/stderr line (none while only part of a character has
    // come), a display's result; none for anything else.
    std::vector<Json> event(const Json& event, const std::string& timestamp);
    // The lines for run_code's answer before the count and the end: output still held, the
    // cell's value as the main result, its exception (or an agent error) as the error.
    std::vector<Json> answer(const Json& answer, const std::string& timestamp);

private:
    Utf8Carry stdout_;
    Utf8Carry stderr_;
};

Json output_line(std::string_view stream, std::string text, const std::string& timestamp);
// A result from MIME forms ({"text/html": ..., "image/png": base64, ...}); `text` (the
// cell's value) wins over a text/plain form.
Json result_line(const Json& formats, bool is_main_result, const std::optional<std::string>& text);
Json error_line(std::string name, std::string value, std::string traceback);
Json executions_line(uint64_t execution_count);
Json end_of_execution_line();
// The line on the wire: compact JSON, ASCII only, and "\n" (no newline inside: JSON escapes
// them).
std::string ndjson_line(const Json& line);

// Now, as the official server stamps its output lines: ISO 8601 in UTC, in microseconds.
std::string line_timestamp();

} // namespace agentvm
