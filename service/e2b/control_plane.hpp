// E2B's control plane (docs/e2b.md, "Control plane"): create, connect, list, info, kill,
// timeout, metrics, pause, fork and snapshots, mapped onto SandboxManager. Its wire shapes
// (request bodies, the Sandbox, SandboxDetail and ListedSandbox objects, paging) are in
// control_plane_wire.hpp; this file only maps them onto serve's sandboxes.
//
// What E2B keeps of a sandbox that serve's settings have no field for (the templateID it was
// created as, its alias) is kept in the sandbox's settings under facade["e2b"], so that it
// goes with the sandbox through pause, resume and fork without a table here.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "service/e2b/control_plane_wire.hpp"
#include "service/e2b/sandbox_tokens.hpp"
#include "service/fleet/peer_fetcher.hpp"
#include "service/http_server.hpp"
#include "service/idempotent_creates.hpp"
#include "service/sandbox_manager.hpp"
#include "service/sandbox_usage.hpp"

namespace agentvm {

class E2bControlPlane {
public:
    // `peers`: the other nodes of the fleet, whose lists Sandbox.list gathers (none: this node's).
    E2bControlPlane(SandboxManager& manager, const SandboxTokens& tokens, PeerFetcher* peers = nullptr)
        : manager_(manager), tokens_(tokens), peers_(peers)
    {
    }

    // The handler and limits of a control-plane request (authentication is E2bApi's).
    HttpServer::Admission admit(HttpExchange& head);

private:
    using Exchange = std::shared_ptr<HttpExchange>;

    void handle(const Exchange& exchange);
    void route(const Exchange& exchange);
    void create(const Exchange& exchange, const Json& body);
    // A repeat of a create under its Idempotency-Key: the sandbox `id` its first made, as it is now.
    void answer_made(HttpExchange& repeat, const std::string& id);
    void connect(const Exchange& exchange, const std::string& id, const Json& body);
    void list(const Exchange& exchange);
    void list_snapshots(const Exchange& exchange);
    void delete_snapshot(const Exchange& exchange, const std::string& id);
    // /sandboxes/{id}[/ACTION] of a sandbox that runs, or is paused.
    void sandbox_request(const Exchange& exchange, const std::string& id, const std::string& action);
    void running_request(const Exchange& exchange, const std::shared_ptr<Sandbox>& sandbox, const std::string& action);
    void paused_request(const Exchange& exchange, const PausedSandbox& paused, const std::string& action);
    void fork(const Exchange& exchange, Sandbox& parent, const Json& body);
    void metrics(const Exchange& exchange, const Sandbox& sandbox);

    E2bSandboxView view_of(const Sandbox& sandbox);
    E2bSandboxView view_of(const PausedSandbox& paused);
    // What is known of the VMs of pool `pool` (read once per pool).
    const VmShape& shape_of(const std::string& pool);
    // The pool's or serve's default rules, as those of a sandbox created without any.
    std::optional<EgressRules> default_egress(const std::string& pool) const;

    SandboxManager& manager_;
    const SandboxTokens& tokens_;
    PeerFetcher* peers_;
    std::map<std::string, VmShape> shapes_;
    IdempotentCreates creates_;  // E2B's Idempotency-Keys, apart from the native API's
    CpuMeter cpu_;
};

} // namespace agentvm
