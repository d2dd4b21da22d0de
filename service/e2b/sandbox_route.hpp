// How a sandbox's traffic names its sandbox and port (the headers the SDKs send to E2B's
// shared sandbox host), and the sandbox it reaches: nullptr answers 502, as E2B's proxy does
// for a sandbox that is not running, which the SDKs read as "not running" or a timeout.
#pragma once

#include <memory>
#include <string>

#include "service/http_server.hpp"
#include "service/sandbox_manager.hpp"

namespace agentvm {

inline constexpr const char* sandbox_id_header = "E2b-Sandbox-Id";
inline constexpr const char* sandbox_port_header = "E2b-Sandbox-Port";
inline constexpr int envd_port = 49983;
inline constexpr int interpreter_port = 49999;

// The running sandbox `sandbox_id` (from the request's E2b-Sandbox-Id, or the sandbox that
// signed its URL), or nullptr (none, paused, ended, stopping).
std::shared_ptr<Sandbox> routed_sandbox(SandboxManager& manager, const std::string& sandbox_id);

// "<port>-<id>.<domain>[:N]" -> {port, id} (E2B's getHost(port) names a sandbox's port so);
// nothing for any other host. Compared without case, as DNS names are.
std::optional<std::pair<std::string, std::string>> sandbox_host(const std::string& host, const std::string& domain);

// The refusal for a request whose sandbox is not running, naming why.
Refusal sandbox_not_running(SandboxManager& manager, const std::string& sandbox_id);

} // namespace agentvm
