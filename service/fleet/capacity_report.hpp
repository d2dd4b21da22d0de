// What one serve tells the balancer in front of a fleet of them (docs/api.md, "/healthz" and
// "--agent-check"): whether it takes creates (ok), is going away (draining), or cannot start VMs
// (maint), and how much of its capacity is free, as a weight. One pure computation from a
// snapshot of the manager's numbers, shared by the HAProxy agent-check line and /healthz, so
// that the two never disagree.
//
// The weight, N in 0..100 (HAProxy's agent "N%": a share of the server's configured weight):
//
//     cold  = max_sandboxes - running, or 0 when available_mib < reserve_mib
//     score = cold + warm_bonus * warm
//     full  = max_sandboxes + (warm_bonus - 1) * min(warm_target, max_sandboxes)
//     N     = round(100 * score / full), at least 1 when score > 0, at most 100
//
// `running` counts the warm VMs too (they hold a place under max_sandboxes), so an idle serve
// whose pools are full scores `full`: 100%. A warm VM weighs warm_bonus cold places: a create
// that takes one is answered at once, while a cold one waits for a VM to boot, so of two nodes
// with the same free places the one with warm VMs draws more creates. N is 0 exactly when no
// create would be admitted (Admission, SandboxManager::create): no warm VM, and either every
// place taken or the host under its memory reserve. A free place under the memory reserve
// counts for nothing: only warm VMs (which admission hands out whatever the memory) do.
//
// maint: every configured pool's last `maint_after_failures` VM starts failed (refill's and
// creates' alike; a start that got to ready resets its pool's count), the latest less than
// `maint_probe_after` ago. Once that long has passed without a new failure the node is offered
// again, so that a create (or the pools' own refill) can find out whether it has recovered.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "protocol/agent_protocol.hpp"

namespace agentvm {

inline constexpr unsigned warm_bonus = 4;
inline constexpr unsigned maint_after_failures = 3;
inline constexpr std::chrono::seconds maint_probe_after{60};

// One configured pool's recent VM starts.
struct PoolStarts {
    std::string name;
    unsigned failed_in_row = 0;
    std::chrono::steady_clock::time_point last_failure{};
};

struct CapacityInputs {
    std::string node_id;
    bool draining = false;
    unsigned warm = 0;         // ready VMs a create can take now, every configured pool
    unsigned warm_target = 0;  // the configured pools' targets, summed
    size_t running = 0;        // VMs counted against max_sandboxes, warm ones included
    unsigned max_sandboxes = 0;
    uint64_t available_mib = 0;
    uint64_t reserve_mib = 0;
    std::vector<PoolStarts> pools;  // the configured pools
    std::chrono::steady_clock::time_point now{};
};

enum class NodeStatus { ok, draining, maint };

struct CapacityReport {
    NodeStatus status = NodeStatus::ok;
    unsigned weight = 0;  // 0..100; 0 while draining or in maint
    std::string reason;   // why maint, else empty
    // Echoed from the inputs for /healthz.
    std::string node_id;
    unsigned warm = 0;
    size_t running = 0;
    unsigned max_sandboxes = 0;
    uint64_t available_mib = 0;
    uint64_t reserve_mib = 0;

    // The agent-check reply, '\n' ended: "ready up N%", "drain", or "maint fail #REASON".
    std::string agent_line() const;
    // /healthz's body.
    Json json() const;
    // 200 when ok, else 503 (so that `option httpchk GET /healthz` takes the node out).
    int http_status() const { return status == NodeStatus::ok ? 200 : 503; }
};

const char* status_name(NodeStatus status);

// Why serve cannot start VMs (the maint rule above), or nothing when it can, or may again.
std::optional<std::string> start_trouble(const std::vector<PoolStarts>& pools,
                                         std::chrono::steady_clock::time_point now);
// The free share of capacity, by the formula above (ignores draining and maint).
unsigned capacity_weight(const CapacityInputs& inputs);
CapacityReport capacity_report(const CapacityInputs& inputs);

} // namespace agentvm
