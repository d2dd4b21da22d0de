// The native API (docs/api.md) as a facade: /healthz, /metrics and /v1/sandboxes, mapped onto
// SandboxManager's operations. It takes every request no other facade took, so an unknown
// path is answered here (404, after authentication like any other).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "service/facade.hpp"
#include "service/fleet/peer_fetcher.hpp"
#include "service/idempotent_creates.hpp"
#include "service/ports/guest_ports.hpp"
#include "service/sandbox_manager.hpp"

namespace agentvm {

class NativeApi : public Facade {
public:
    // `token`: what client_auth.hpp requires of every request, when set. `peers`: the other
    // nodes of the fleet, whose lists GET /v1/sandboxes gathers (none: this node's alone).
    // `ports`: where requests to a sandbox's guest ports go (.../ports/P/..., .../tcp/P).
    NativeApi(SandboxManager& manager, std::optional<std::string> token, GuestPorts& ports,
              PeerFetcher* peers = nullptr)
        : manager_(manager), token_(std::move(token)), ports_(ports), peers_(peers)
    {
    }

    bool takes(const HttpExchange& head) const override;
    HttpServer::Admission admit(HttpExchange& head) override;

private:
    void handle(const std::shared_ptr<HttpExchange>& exchange);
    void route(const std::shared_ptr<HttpExchange>& exchange);
    void create(const std::shared_ptr<HttpExchange>& exchange);
    // GET /v1/sandboxes: this node's, and with peers the fleet's (service/fleet/peer_listing.hpp).
    void list(const std::shared_ptr<HttpExchange>& exchange);
    // A repeat of a create (`fork`: of a fork) under its Idempotency-Key: the sandboxes `ids`
    // its first made, as they are now.
    void answer_made(HttpExchange& repeat, const std::vector<std::string>& ids, bool fork);
    void paused_request(const std::shared_ptr<HttpExchange>& exchange, const std::string& id,
                        const std::string& action);
    void sandbox_request(const std::shared_ptr<HttpExchange>& exchange, const std::string& id,
                         const std::string& action);
    // An agent op with the body's fields; `follows`: an attach or a watch (agent_ops.hpp).
    void call(const std::shared_ptr<HttpExchange>& exchange, const std::shared_ptr<Sandbox>& sandbox,
              const std::string& op, bool follows);
    // DELETE .../calls/SEQ: the agent's cancel of a running call.
    void cancel(const std::shared_ptr<HttpExchange>& exchange, const std::shared_ptr<Sandbox>& sandbox,
                const std::string& seq_text);
    // GET .../files/stat and .../files/list: the agent's stat and list_dir.
    void file_info(const std::shared_ptr<HttpExchange>& exchange, const std::shared_ptr<Sandbox>& sandbox,
                   const std::string& op, const std::string& file);

    // .../ports/P[/PATH]: an HTTP request to the guest's port P; .../tcp/P: a raw stream to it.
    void port_request(const std::shared_ptr<HttpExchange>& exchange, Sandbox& sandbox, const std::string& action);

    SandboxManager& manager_;
    std::optional<std::string> token_;
    GuestPorts& ports_;
    PeerFetcher* peers_;
    IdempotentCreates creates_;  // the native API's Idempotency-Keys, creates' and forks'
};

} // namespace agentvm
