// The sandboxes of one serve (docs/api.md, "Sandboxes" and "Pools"): every VM it runs, the
// sandboxes handed out by id, their expiry, and drain. It composes the parts that do the rest:
// Pools (warm VMs and refill), Admission (max_sandboxes, the memory reserve), SandboxSnapshots
// (fork, pause, resume) and SandboxMetrics (/metrics).
//
// A create takes a warm VM (the warm path) or starts one (the cold path), if admitted.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/event_loop.hpp"
#include "core/loop_timer.hpp"
#include "service/admission.hpp"
#include "service/egress/sandbox_egress.hpp"
#include "service/fleet/capacity_report.hpp"
#include "service/pools.hpp"
#include "service/problem.hpp"
#include "service/ports/guest_socket_dirs.hpp"
#include "service/sandbox.hpp"
#include "service/sandbox_metrics.hpp"
#include "service/sandbox_snapshots.hpp"
#include "service/vm_users/jail_ids.hpp"

namespace agentvm {

struct ManagerConfig {
    std::string program;  // the agentvm binary
    // What every sandbox id starts with (service/sandbox_ids.hpp): --node-id, else the host's
    // short name; and this serve's instance, drawn when empty.
    std::string node_id;
    std::string instance_id;
    std::vector<PoolConfig> pools;
    unsigned max_sandboxes = 64;  // VMs in all: warm, starting, handed out (not those stopping)
    uint64_t mem_reserve_mib = 1024;
    unsigned refill_concurrency = 2;
    size_t history_limit = 256;
    // Each pool VM runs one `exec true` before it counts as ready: a sandbox's first call is
    // then as fast as its later ones, at the cost of the pages that call leaves written.
    bool pool_warmup = false;
    // Where live snapshots and paused sandboxes are kept (SnapshotStore); empty: no fork,
    // pause or resume.
    std::string state_dir;
    std::chrono::seconds paused_retention{7 * 86400};
    // SandboxFusion's /run_code and /run_jupyter (service/fusion/fusion_job.hpp), whose answers serve
    // builds whole: the bytes of fetch_files one request brings back, all files together
    // (--fusion-fetch-max), and what one run, or all the cells of one request together, keep
    // of each output stream (--fusion-output-max).
    uint64_t fusion_fetch_max = uint64_t{64} << 20;
    uint64_t fusion_output_max = uint64_t{16} << 20;
    // --e2b-domain: the E2B facade's sandbox domain, where "<port>-<id>.<domain>" names a
    // sandbox's port (its SDKs' getHost); empty: none.
    std::string e2b_domain;
    // Where sandboxes may connect out when their create says nothing (--egress-allow,
    // --egress-deny; checked before), and the limits of every sandbox's egress proxy.
    EgressRules egress_default;
    EgressLimits egress_limits;
    // The uids (and gids) its VMMs run as, one per VM (--jail-uid-range;
    // service/vm_users/jail_ids.hpp); none: they keep serve's own.
    std::optional<JailIdRange> jail_ids;
};

// What the manager reads of the host, which tests replace: the time its sweep expires
// sandboxes and paused sandboxes by (and refill's back-off counts in), and the memory
// admission measures against the reserve.
struct HostProbes {
    std::function<Sandbox::Clock::time_point()> now = &Sandbox::Clock::now;
    std::function<std::chrono::system_clock::time_point()> wall_now = &std::chrono::system_clock::now;
    MemoryProbe available_mib = &host_available_mib;
};

inline constexpr unsigned max_fork_count = 64;

class SandboxManager : private SandboxSnapshots::Registry {
public:
    using CreateDone = agentvm::CreateDone;
    using ForkDone = SandboxSnapshots::ForkDone;
    using PauseDone = SandboxSnapshots::PauseDone;

    SandboxManager(EventLoop& loop, ManagerConfig config, HostProbes probes = {});
    ~SandboxManager();
    SandboxManager(const SandboxManager&) = delete;
    SandboxManager& operator=(const SandboxManager&) = delete;

    // Calls done once: with the sandbox (assigned `settings`, its id set here), or a refusal.
    void create(const std::string& pool, Sandbox::Settings settings, CreateDone done);

    // Fork, pause and resume: SandboxSnapshots.
    void fork(Sandbox& parent, unsigned count, ForkDone done) { snapshots_.fork(parent, count, std::move(done)); }
    void pause(Sandbox& sandbox, PauseDone done, bool end_calls = false)
    {
        snapshots_.pause(sandbox, std::move(done), end_calls);
    }
    void resume(const std::string& id, CreateDone done) { snapshots_.resume(id, std::move(done)); }
    const PausedSandbox* find_paused(const std::string& id) const { return snapshots_.find_paused(id); }
    std::vector<const PausedSandbox*> paused() const { return snapshots_.paused(); }
    // By value: a caller may pass the id of the very record it removes.
    void remove_paused(std::string id, const std::string& reason) { snapshots_.remove_paused(std::move(id), reason); }
    // Kept snapshots (SandboxSnapshots::keep), and creates from them.
    using KeepDone = SandboxSnapshots::KeepDone;
    void keep_snapshot(Sandbox& sandbox, std::vector<std::string> names, KeepDone done)
    {
        snapshots_.keep(sandbox, std::move(names), std::move(done));
    }
    void create_from_kept(const std::string& id, Sandbox::Settings settings, CreateDone done)
    {
        snapshots_.create_from_kept(id, std::move(settings), std::move(done));
    }
    const KeptSnapshot* find_kept(const std::string& id) const { return snapshots_.find_kept(id); }
    std::vector<const KeptSnapshot*> kept_snapshots() const { return snapshots_.kept(); }
    bool remove_kept(const std::string& id) { return snapshots_.remove_kept(id); }
    // The pool a create without one uses: the only pool, or "default".
    std::string default_pool() const { return pools_.default_pool(); }
    const ManagerConfig& config() const { return config_; }
    // The loop the sandboxes run on, for a facade's own timers (a stream's keepalive).
    EventLoop& loop() { return loop_; }
    // The pools of VMs restored from live snapshots (fork, resume) still in use.
    size_t restore_pools() const { return pools_.restore_pools(); }

    // Holders keep a weak_ptr: a sandbox lives until its VM has ended.
    std::shared_ptr<Sandbox> find(const std::string& id) override;
    // Why a sandbox that is gone ended, while that is remembered (the last 4096).
    std::optional<std::string> ended_reason(const std::string& id) const;
    std::vector<Sandbox*> sandboxes();
    // Ends a sandbox now: gone from the list at once, its VM stopped.
    void remove(Sandbox& sandbox, const std::string& reason) override;

    // SIGTERM: no more creates or refills; once no call runs (or after `grace`), every VM is
    // stopped; `done` runs when the last has ended.
    void drain(std::chrono::milliseconds grace, std::function<void()> done);

    std::string metrics_text() const;
    // A sandbox's egress proxy, if its policy allows anything (a facade changes its policy).
    EgressProxy* egress_of(Sandbox& sandbox) { return egress_.find(sandbox); }
    // The rules a create into `pool` that names none gets: the pool's, else serve's.
    const EgressRules& default_egress(const std::string& pool) const;
    // New rules for a running sandbox: its proxy judges new connections by them (opened, with
    // the proxy's env, if it had none; closed if they allow nothing). Throws Error when a
    // proxy cannot be opened.
    void change_egress(Sandbox& sandbox, EgressRules rules);
    // What the balancer is told (service/fleet/capacity_report.hpp): /healthz and --agent-check.
    CapacityInputs capacity_inputs() const;

private:
    struct Vm {
        // The live snapshot it was restored from, if any. Before `sandbox`, so that it is
        // released only once the sandbox is destroyed.
        SnapshotHold origin;
        std::shared_ptr<Sandbox> sandbox;
        Pool* pool;
        bool refill = false;      // started to become warm, not for a waiting create
        bool low_weight = false;  // started at pool_cpu_weight
        CreateDone waiting;       // the create (cold, fork, resume) it was started for
        Sandbox::Settings settings;
        Sandbox::Clock::time_point requested{};
        std::string outbox;  // where its VMM writes live snapshots (SandboxSnapshots::new_outbox), if any
        std::string socket_dir;  // where its VMM's end of vsock listens (GuestSocketDirs)
        std::optional<uint32_t> jail_id;  // its VMM's uid and gid (ManagerConfig::jail_ids)
    };

    // SandboxSnapshots::Registry
    void unlist(const std::string& id) override { by_id_.erase(id); }
    void remember_end(const std::string& id, const std::string& reason) override;
    void forget_end(const std::string& id) override { ended_.erase(id); }
    const std::string& outbox_of(Sandbox& sandbox) const override;
    void start_for(Pool& pool, Sandbox::Settings settings, Sandbox::Clock::time_point requested, SnapshotHold origin,
                   CreateDone done) override;

    // VMs that count against max_sandboxes: all but those on their way out.
    size_t live_vms() const;
    // for_pool: a refill's VM, started at the pool's low CPU weight.
    Vm& start_vm(Pool& pool, bool for_pool);
    void on_ready(Sandbox& sandbox);
    void on_exit(Sandbox& sandbox, const std::string& why);
    void on_call_answered(const Json& answer, double seconds);
    void hand_out(Vm& vm, Sandbox::Settings settings, Sandbox::Clock::time_point requested, bool warm);
    // The sandbox's egress proxy, and its proxy settings in `settings.env`, if its policy
    // allows anything.
    void open_egress(Vm& vm, Sandbox::Settings& settings);
    // Starts the VM's egress proxy, its socket shared with the VM's own gid. Throws Error.
    void open_egress_proxy(Vm& vm, EgressPolicy policy);
    void sweep();
    // A sandbox past its lifetime or idle time: ended, or paused when its settings say so.
    void expire(Sandbox& sandbox, const std::string& why);
    void check_drained();
    std::string new_id() const;

    EventLoop& loop_;
    ManagerConfig config_;
    HostProbes probes_;
    bool cpu_weights_ = false;
    SandboxMetrics metrics_;
    Admission admission_;
    Pools pools_;
    // Before vms_: the store in it outlives the holds VMs keep.
    SandboxSnapshots snapshots_;
    std::map<Sandbox*, Vm> vms_;
    std::map<std::string, Sandbox*> by_id_;
    std::map<std::string, std::string> ended_;
    std::deque<std::string> ended_order_;
    std::set<std::string> auto_pausing_;  // expired sandboxes whose pause is under way
    GuestSocketDirs socket_dirs_;
    std::optional<JailIds> jail_ids_;
    std::vector<std::shared_ptr<Sandbox>> graveyard_;
    // After vms_ and graveyard_: its proxies, which hold their sandboxes, go first.
    SandboxEgress egress_;  // destroyed on the next turn of the loop
    LoopTimer bury_timer_;
    LoopTimer sweep_timer_;
    LoopTimer drain_timer_;
    bool drain_grace_over_ = false;
    std::function<void()> drained_;
};

} // namespace agentvm
