// Who may use the native API and SandboxFusion's endpoints. With a token set, a request must
// carry it: "Authorization: Bearer TOKEN", or TOKEN as the password of HTTP Basic auth (any
// user name). Without one, only this host's own clients (local_client.hpp says why): an
// Origin header, if any, must be a loopback origin, and on TCP the Host must name a loopback
// address (a Unix socket, which no browser reaches, needs no Host).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "service/http_server.hpp"
#include "service/problem.hpp"

namespace agentvm {

// The refusal for a request these rules turn away (unauthorized, with the WWW-Authenticate
// header added to its answer; or forbidden), nullopt for one they let in.
std::optional<Refusal> client_refusal(HttpExchange& head, const std::optional<std::string>& token);

// Compares without an early exit, so the time taken says nothing of where a guess went wrong.
bool same_secret(std::string_view a, std::string_view b);

} // namespace agentvm
