#include "service/e2b/e2b_api.hpp"

#include <chrono>

#include <fmt/format.h>

#include "service/client_auth.hpp"
#include "service/e2b/e2b_errors.hpp"
#include "service/e2b/file_access.hpp"
#include "service/e2b/sandbox_route.hpp"
#include "service/local_client.hpp"

namespace agentvm {
namespace {

// The control plane's paths (docs/e2b.md, "Control plane"); envd's and the interpreter's
// never come without E2b-Sandbox-Id.
bool control_plane_path(const std::string& path)
{
    return path == "/v2/sandboxes" || path.starts_with("/v2/sandboxes/") || path.starts_with("/sandboxes/")
           || path == "/snapshots" || path.starts_with("/templates/");
}

// A refusal answered before any part of the facade has the request: the shape is the
// control plane's, which is also what envd's plain HTTP and the interpreter read.
HttpServer::Admission refused(ServiceError code, std::string message, const ErrorWriter& errors)
{
    HttpServer::Admission admission;
    admission.errors = &errors;
    admission.refusal = Refusal{code, std::move(message), std::nullopt};
    return admission;
}

} // namespace

E2bApi::E2bApi(SandboxManager& manager, std::optional<std::string> token, PeerFetcher* peers)
    : manager_(manager),
      token_(std::move(token)),
      tokens_(manager.config().state_dir),
      control_(manager, tokens_, peers),
      envd_(manager, tokens_),
      interpreter_(manager, tokens_)
{
}

bool E2bApi::takes(const HttpExchange& head) const
{
    return head.header(sandbox_id_header) || control_plane_path(head.path()) || signed_file_url(head);
}

bool E2bApi::signed_file_url(const HttpExchange& head)
{
    return head.path() == "/files" && head.query("signature");
}

std::optional<std::string> E2bApi::signer_of(const HttpExchange& head)
{
    FileAccess access{std::nullopt,
                      head.query("signature"),
                      head.query("signature_expiration"),
                      head.query("path").value_or(""),
                      head.query("username").value_or(""),
                      head.method() == "GET" ? "read" : "write"};
    const long long now = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
    for (Sandbox* sandbox : manager_.sandboxes())
        if (!file_access_refusal(tokens_, sandbox->id(), access, now))
            return sandbox->id();
    return std::nullopt;
}

HttpServer::Admission E2bApi::admit(HttpExchange& head)
{
    if (const std::optional<std::string> sandbox_id = head.header(sandbox_id_header))
        return admit_sandbox_traffic(head, *sandbox_id);
    // A signed URL handed to a plain client (the SDKs' downloadUrl()/uploadUrl() with
    // E2B_SANDBOX_URL set) names no sandbox: the sandbox whose token made the signature is it.
    if (signed_file_url(head)) {
        if (const std::optional<std::string> signer = signer_of(head))
            return envd_.admit(head, *signer);
        return refused(ServiceError::unauthorized,
                       "the URL's signature is not one any running sandbox's envd token made for this path, "
                       "operation and user (or it has expired)",
                       e2b_http_errors());
    }
    HttpServer::Admission admission = control_.admit(head);
    if (!admission.refusal)
        admission.refusal = control_refusal(head);
    return admission;
}

std::optional<Refusal> E2bApi::control_refusal(HttpExchange& head) const
{
    const std::optional<std::string> key = head.header("X-API-KEY");
    if (token_) {
        if (key && same_secret(*key, *token_))
            return std::nullopt;
        return Refusal{ServiceError::unauthorized,
                       key ? "Invalid API key: X-API-KEY is not this serve's token"
                           : "An API key is required: X-API-KEY must carry serve's token (E2B_API_KEY)",
                       std::nullopt};
    }
    // Without a token, the same rule as the native API's: this host's own clients only.
    return client_refusal(head, std::nullopt);
}

HttpServer::Admission E2bApi::admit_sandbox_traffic(HttpExchange& head, const std::string& sandbox_id)
{
    const std::optional<std::string> port = head.header(sandbox_port_header);
    if (port == std::to_string(envd_port))
        return envd_.admit(head, sandbox_id);
    if (port == std::to_string(interpreter_port))
        return interpreter_.admit(head, sandbox_id);
    return refused(ServiceError::ended,
                   fmt::format("sandbox {}: port {} is not served (agentvm answers envd on {} and the code "
                               "interpreter on {})",
                               sandbox_id, port.value_or("(none)"), envd_port, interpreter_port),
                   e2b_http_errors());
}

} // namespace agentvm
