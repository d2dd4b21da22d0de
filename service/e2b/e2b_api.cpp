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

E2bApi::E2bApi(SandboxManager& manager, std::optional<std::string> token, GuestPorts& ports, PeerFetcher* peers)
    : manager_(manager),
      token_(std::move(token)),
      tokens_(manager.config().state_dir),
      control_(manager, tokens_, peers),
      envd_(manager, tokens_),
      interpreter_(manager, tokens_),
      ports_(ports)
{
}

bool E2bApi::takes(const HttpExchange& head) const
{
    return head.header(sandbox_id_header) || host_route(head) || control_plane_path(head.path())
           || signed_file_url(head);
}

std::optional<std::pair<std::string, std::string>> E2bApi::host_route(const HttpExchange& head) const
{
    const std::string& domain = manager_.config().e2b_domain;
    if (domain.empty())
        return std::nullopt;
    return sandbox_host(head.header("Host").value_or(""), domain);
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
        return admit_sandbox_traffic(head, *sandbox_id, head.header(sandbox_port_header));
    if (const auto routed = host_route(head))
        return admit_sandbox_traffic(head, routed->second, routed->first);
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

HttpServer::Admission E2bApi::admit_sandbox_traffic(HttpExchange& head, const std::string& sandbox_id,
                                                    const std::optional<std::string>& port)
{
    if (port == std::to_string(envd_port))
        return envd_.admit(head, sandbox_id);
    if (port == std::to_string(interpreter_port))
        return interpreter_.admit(head, sandbox_id);
    if (!port)
        return refused(ServiceError::bad_field,
                       fmt::format("sandbox {}: the request names no port ({} is missing)", sandbox_id,
                                   sandbox_port_header),
                       e2b_http_errors());
    return admit_port_traffic(sandbox_id, *port);
}

HttpServer::Admission E2bApi::admit_port_traffic(const std::string& sandbox_id, const std::string& port_text)
{
    // As E2B's proxy: a sandbox's ports are public unless its owner said otherwise; serve's
    // token is not asked for (a browser sent to getHost(port) carries none).
    HttpServer::Admission admission;
    admission.errors = &e2b_http_errors();
    admission.streams_body = true;
    admission.handler = [this, sandbox_id, port_text](const std::shared_ptr<HttpExchange>& exchange) {
        try {
            const uint16_t port = GuestPorts::port_number(port_text);
            std::shared_ptr<Sandbox> sandbox = routed_sandbox(manager_, sandbox_id);
            if (!sandbox)
                return exchange->refuse(sandbox_not_running(manager_, sandbox_id));
            ports_.relay_http(exchange, *sandbox, port, exchange->target(),
                              {sandbox_id_header, sandbox_port_header, "E2B-Traffic-Access-Token"});
        } catch (const RefusedRequest& e) {
            exchange->refuse(e.code, e.what());
        }
    };
    return admission;
}

} // namespace agentvm
