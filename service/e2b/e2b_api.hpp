// E2B's API as a facade (docs/e2b.md): what the official E2B SDKs send, unmodified, with
// E2B_API_URL and E2B_SANDBOX_URL both set to serve's address. Three kinds of traffic share
// serve's listeners, told apart by their heads alone:
// - a request with an E2b-Sandbox-Id header is a sandbox's: E2b-Sandbox-Port 49983 is envd
//   (envd_api.hpp), 49999 the code interpreter (interpreter_api.hpp). Each carries that
//   sandbox's own token (sandbox_tokens.hpp); an unknown, paused or ended sandbox is 502,
//   as E2B's proxy answers;
// - /v2/sandboxes..., /sandboxes/..., /snapshots and /templates/... are the control plane
//   (control_plane.hpp), which takes serve's token as X-API-KEY;
// - /files with a URL signature and no E2b-Sandbox-Id is a signed URL the SDK handed out:
//   the sandbox whose envd token made the signature is its sandbox.
// Nothing here runs a sandbox: each part maps E2B's calls onto serve's sandboxes and their
// agent calls, as the native API does.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "service/ports/guest_ports.hpp"
#include "service/e2b/control_plane.hpp"
#include "service/e2b/envd_api.hpp"
#include "service/e2b/interpreter_api.hpp"
#include "service/e2b/sandbox_tokens.hpp"
#include "service/facade.hpp"
#include "service/sandbox_manager.hpp"

namespace agentvm {

class E2bApi : public Facade {
public:
    // `token`: the X-API-KEY every control-plane request must carry, when set; without one
    // only this host's own clients are let in (client_auth.hpp).
    // `peers`: the fleet's other nodes, whose lists Sandbox.list gathers (control_plane.hpp).
    // `ports`: where traffic for any other E2b-Sandbox-Port goes (the sandbox's own servers).
    E2bApi(SandboxManager& manager, std::optional<std::string> token, GuestPorts& ports, PeerFetcher* peers = nullptr);

    bool takes(const HttpExchange& head) const override;
    HttpServer::Admission admit(HttpExchange& head) override;

private:
    // GET or POST /files with a signature and no E2b-Sandbox-Id, and the sandbox that signed it.
    static bool signed_file_url(const HttpExchange& head);
    std::optional<std::string> signer_of(const HttpExchange& head);
    // A sandbox's traffic, named by E2b-Sandbox-Id and E2b-Sandbox-Port or by its Host.
    HttpServer::Admission admit_sandbox_traffic(HttpExchange& head, const std::string& sandbox_id,
                                                const std::optional<std::string>& port);
    // With --e2b-domain, a Host "<port>-<id>.<domain>": {port, id}.
    std::optional<std::pair<std::string, std::string>> host_route(const HttpExchange& head) const;
    std::optional<Refusal> control_refusal(HttpExchange& head) const;
    // Traffic for a port of the sandbox's own (getHost(port)): carried to its guest as it is.
    HttpServer::Admission admit_port_traffic(const std::string& sandbox_id, const std::string& port);

    SandboxManager& manager_;
    std::optional<std::string> token_;
    SandboxTokens tokens_;
    E2bControlPlane control_;
    EnvdApi envd_;
    InterpreterApi interpreter_;
    GuestPorts& ports_;
};

} // namespace agentvm
