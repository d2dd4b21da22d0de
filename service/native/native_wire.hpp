// The native API's wire format (docs/api.md): the JSON it shows a sandbox and a paused one
// as, and its errors: {"error": CODE, "message": TEXT} with the status each code answers.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "protocol/agent_protocol.hpp"
#include "service/http_server.hpp"
#include "service/problem.hpp"
#include "service/sandbox.hpp"
#include "service/sandbox_manager.hpp"

namespace agentvm {

// A JSON answer's text: one line, invalid UTF-8 replaced.
std::string json_text(const Json& value);

Json sandbox_json(const Sandbox& sandbox);
Json paused_json(const PausedSandbox& paused);

// The HTTP status of a refusal (docs/api.md, "Errors").
int native_status(ServiceError code);
// The HTTP status of an error the guest's agent or its episode answered a call with (500
// for a code not in native_agent_statuses()).
int native_agent_status(std::string_view code);
struct AgentErrorStatus {
    std::string_view code;
    int status;
};
std::span<const AgentErrorStatus> native_agent_statuses();

// Errors in the native shape. SandboxFusion's endpoints answer refused requests in it too.
const ErrorWriter& native_errors();

} // namespace agentvm
