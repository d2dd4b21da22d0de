// Reading a request's fields, shared by the parsers of every op (agent_protocol.cpp and the
// op groups beside it): each throws CallError (missing_field, bad_field) naming the field.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "protocol/agent_protocol.hpp"

namespace agentvm {

[[noreturn]] void bad_field(const std::string& name, const std::string& why);
const Json& require(const Json& object, const std::string& name);
std::string require_string(const Json& object, const std::string& name);
std::optional<std::string> optional_string(const Json& object, const std::string& name);
// Absent or null: false.
bool optional_bool(const Json& object, const std::string& name);
// "timeout": a positive number of seconds up to max_call_timeout_s; absent or null: none.
std::optional<double> optional_timeout(const Json& object);
// "max_output": bytes; absent or null: default_max_output.
uint64_t optional_max_output(const Json& object);
// A command's "argv" (required): a non-empty array of strings without NUL.
std::vector<std::string> parse_argv(const Json& object);
// A command's "env" (optional): names without '=' or NUL, string values without NUL.
std::map<std::string, std::string> parse_env(const Json& object);
// A call's "user" (optional): 1 to max_user_name_bytes of a name as /etc/passwd can hold it
// (no NUL, ':' or newline). Whether the guest has that user is the agent's to say.
std::optional<std::string> parse_user(const Json& object);
// A process's "tag" (optional): the client's own name for it, 1 to max_tag_bytes.
std::optional<std::string> parse_tag(const Json& object);

// "stream": false (or absent), true (events, and the output in the response too) or "only"
// (events; the response carries no output, so it stays small however much was sent).
template <typename Request>
void parse_stream(const Json& object, Request& request)
{
    auto it = object.find("stream");
    if (it == object.end() || it->is_null())
        return;
    if (it->is_boolean()) {
        request.stream = it->get<bool>();
        return;
    }
    if (*it != "only")
        bad_field("stream", "must be true, false or \"only\"");
    request.stream = true;
    request.output_in_response = false;
}

} // namespace agentvm
