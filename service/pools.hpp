// The pools of one serve (docs/api.md, "Pools and admission control"): per pool (a snapshot),
// N VMs kept restored and idle (warm) for creates to take, refilled in the background at most
// refill_concurrency starts at once, a failed start retried after a back-off, and never past
// what Admission allows. Restore pools, without a target, are the VMs restored from one live
// snapshot (fork, resume), kept only while one of their VMs runs.
//
// The VMs themselves are the manager's: it starts them (StartVm) and reports what happens to
// each (vm_started, refill_ready, refill_failed, vm_ended).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "service/admission.hpp"
#include "service/sandbox.hpp"

namespace agentvm {

struct PoolConfig {
    std::string name;                        // what a create names ("default", or a snapshot path)
    std::vector<std::string> episode_args;  // after `agentvm episode --announce-ready`
    unsigned target = 0;                    // warm VMs to keep
    // Where its sandboxes may connect out when their create names nothing (--pool-egress-allow,
    // --pool-egress-deny); none: serve's --egress-allow/--egress-deny.
    std::optional<EgressRules> egress;
};

struct Pool {
    PoolConfig config;
    std::deque<Sandbox*> warm;  // ready, not handed out
    unsigned starting = 0;      // refills under way
    unsigned warming = 0;       // ready, running the warm-up call
    unsigned vms = 0;           // started and not yet ended, of every kind
    unsigned failures_in_row = 0;
    // Every VM start of the pool, refill's and creates' alike, for the fleet's maint
    // (service/fleet/capacity_report.hpp): failed ones since the last that got to ready.
    unsigned starts_failed_in_row = 0;
    Sandbox::Clock::time_point last_start_failure{};
    Sandbox::Clock::time_point next_refill{};
    uint64_t created_warm = 0;
    uint64_t created_cold = 0;
};

class Pools {
public:
    // Starts a VM of `pool` for its refill (at the pool's low CPU weight); throws on failure.
    using StartVm = std::function<void(Pool& pool)>;
    using Now = std::function<Sandbox::Clock::time_point()>;

    // warmup: each refill's VM runs one `exec true` before it counts as ready.
    Pools(const std::vector<PoolConfig>& configs, unsigned refill_concurrency, bool warmup, Admission& admission,
          StartVm start, Now now);
    Pools(const Pools&) = delete;
    Pools& operator=(const Pools&) = delete;

    Pool* find(const std::string& name);
    // The pool a create without one uses: the only pool, or "default".
    std::string default_pool() const;
    std::vector<std::string> names() const;
    // The configured pools, by name (restore pools are not among them).
    const std::map<std::string, Pool>& configured() const { return pools_; }

    // A ready VM of `pool` for a create, if one is warm; the caller hands it out and refills.
    Sandbox* take_warm(Pool& pool);
    // A create needs room: a warm VM of another pool than `pool` gives way. Whether one did.
    bool evict_spare(const Pool& pool);
    // Starts what the pools lack, as far as concurrency, back-off and admission allow.
    void refill();
    // SIGTERM (after Admission::close): the warm VMs are stopped.
    void drain();

    void vm_started(Pool& pool) { ++pool.vms; }
    // A refill's VM is ready: warmed up (if so configured) and made warm, or stopped if its
    // pool needs it no more.
    void refill_ready(Pool& pool, const std::shared_ptr<Sandbox>& sandbox);
    // A refill's VM ended before it was ready: the pool's next refill waits a back-off.
    void refill_failed(Pool& pool);
    // A VM of `pool` has ended, whatever it was.
    void vm_ended(Pool& pool, Sandbox& sandbox);

    // The pool of VMs restored from `snapshot`, shown under the pool name `name`.
    Pool& restore_pool(const std::string& snapshot, const std::string& name);
    // Forgets a restore pool none of whose VMs is left.
    void forget_if_unused(Pool& pool);
    size_t restore_pools() const { return restore_pools_.size(); }

private:
    void add_warm(Pool& pool, Sandbox& sandbox);

    unsigned refill_concurrency_;
    bool warmup_;
    Admission& admission_;
    StartVm start_;
    Now now_;
    std::map<std::string, Pool> pools_;
    std::map<std::string, Pool> restore_pools_;  // by snapshot path
};

} // namespace agentvm
