// agentvm serve: the per-host sandbox service (docs/api.md), run until SIGINT, SIGTERM or
// SIGHUP, which drain it: no new connections or creates, running calls finish (up to the
// grace period), every VM is stopped, exit 0. Under systemd it reports READY=1 once it
// accepts connections and STOPPING=1 when it starts draining (service/systemd/notify.hpp).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "service/fleet/peers.hpp"
#include "service/listen_spec.hpp"
#include "service/sandbox_manager.hpp"
#include "service/systemd/notify.hpp"

namespace agentvm {

struct ServeConfig {
    std::vector<ListenSpec> listen;
    std::optional<std::string> token;  // every request must carry it when set
    ManagerConfig sandboxes;
    std::chrono::seconds drain_grace{30};
    // --peer and --peers-file: the fleet's nodes whose lists this node's lists gather
    // (docs/fleet.md); the one with this node's id is left out.
    std::vector<Peer> peers;
    // --agent-check: where HAProxy's agent check asks for this node's state and weight (TCP).
    std::optional<ListenSpec> agent_check;
    // $NOTIFY_SOCKET, when systemd started serve as Type=notify.
    std::optional<SystemdNotifier> notifier;
};

// "NAME=N": NAME is "default" (set-up's snapshot, what `agentvm episode` restores without
// --snapshot), a snapshot directory (a path: it holds a '/'), or a template in the store at
// `template_store` (agentvm template). Throws Error naming the problem.
PoolConfig parse_pool_spec(const std::string& text, const std::string& template_store);

// Returns the exit status: 0 after a stop signal.
int run_serve(const ServeConfig& config);

} // namespace agentvm
