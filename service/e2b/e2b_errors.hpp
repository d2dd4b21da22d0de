// E2B's error shapes, one per kind of traffic (docs/e2b.md, "Errors"), each mapping serve's
// refusals (problem.hpp) and the agent's error codes (docs/protocol.md) onto what the official
// SDKs read:
// - the control plane: {"code": STATUS, "message": TEXT}, the body's code deciding not-found
//   and already-paused in the SDK;
// - envd's Connect-RPC (unary calls, and streams refused before they start): a Connect code
//   name in {"code": NAME, "message": TEXT} with the status Connect pairs with it;
// - envd's plain HTTP (/files, /health) and the code interpreter: {"code": STATUS, "message"}.
#pragma once

#include <string>
#include <string_view>

#include "service/http_server.hpp"
#include "service/problem.hpp"

namespace agentvm {

// The control plane's status for a refusal.
int e2b_status(ServiceError code);
// The HTTP status for an agent's error code, on envd's plain HTTP and the code interpreter.
int e2b_agent_status(std::string_view agent_code);

// Connect's code names (connectrpc.com/docs/protocol, "Error codes") and their statuses.
std::string_view connect_code(ServiceError code);
std::string_view connect_code_of_agent(std::string_view agent_code);
int connect_status(std::string_view connect_code);

const ErrorWriter& e2b_control_errors();
const ErrorWriter& e2b_connect_errors();
const ErrorWriter& e2b_http_errors();

} // namespace agentvm
