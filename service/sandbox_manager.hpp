// The sandboxes of one serve: per pool (a snapshot), N VMs kept restored and idle (warm), the
// sandboxes handed out, admission control and expiry (docs/api.md, "Sandboxes" and "Pools").
//
// A create takes a warm VM (the warm path) or starts one (the cold path); the pool refills in
// the background, at most refill_concurrency starts at once, and never past max_sandboxes or
// into the host memory reserve: refill yields to live demand, and a create that would cross
// either is refused (429, 503), never left to the host's OOM killer.
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
#include "service/metrics.hpp"
#include "service/problem.hpp"
#include "service/sandbox.hpp"
#include "service/snapshot_store.hpp"

namespace agentvm {

struct PoolConfig {
    std::string name;                        // what a create names ("default", or a snapshot path)
    std::vector<std::string> episode_args;  // after `agentvm episode --announce-ready`
    unsigned target = 0;                    // warm VMs to keep
};

struct ManagerConfig {
    std::string program;  // the agentvm binary
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
};

inline constexpr unsigned max_fork_count = 64;

class SandboxManager {
public:
    using CreateDone = std::function<void(Sandbox* sandbox, const Refusal* refusal)>;

    SandboxManager(EventLoop& loop, ManagerConfig config);
    ~SandboxManager();
    SandboxManager(const SandboxManager&) = delete;
    SandboxManager& operator=(const SandboxManager&) = delete;

    // Calls done once: with the sandbox (assigned `settings`, its id set here), or a refusal.
    void create(const std::string& pool, Sandbox::Settings settings, CreateDone done);

    // Fork, pause and resume (docs/api.md): each calls `done` once. fork: `count` new
    // sandboxes from a live snapshot of `parent`, which runs on, with its settings and new ids,
    // once all of them are ready (if one fails, the others are removed and the fork refused).
    using ForkDone = std::function<void(const std::vector<Sandbox*>& children, const Refusal* refusal)>;
    void fork(Sandbox& parent, unsigned count, ForkDone done);
    // pause: the sandbox's live snapshot and settings go to disk and its VM ends; it is then
    // listed as paused under its id until resumed, deleted or past --paused-retention.
    using PauseDone = std::function<void(const PausedSandbox* paused, const Refusal* refusal)>;
    void pause(Sandbox& sandbox, PauseDone done);
    // resume: the paused sandbox runs again from its snapshot, under the same id.
    void resume(const std::string& id, CreateDone done);
    const PausedSandbox* find_paused(const std::string& id) const;
    std::vector<const PausedSandbox*> paused() const;
    // By value: a caller may pass the id of the very record it removes.
    void remove_paused(std::string id, const std::string& reason);
    // The pool a create without one uses: the only pool, or "default".
    std::string default_pool() const;
    const ManagerConfig& config() const { return config_; }
    // The pools of VMs restored from live snapshots (fork, resume) still in use.
    size_t restore_pools() const { return restore_pools_.size(); }

    // Holders keep a weak_ptr: a sandbox lives until its VM has ended.
    std::shared_ptr<Sandbox> find(const std::string& id);
    // Why a sandbox that is gone ended, while that is remembered (the last 4096).
    std::optional<std::string> ended_reason(const std::string& id) const;
    std::vector<Sandbox*> sandboxes();
    // Ends a sandbox now: gone from the list at once, its VM stopped.
    void remove(Sandbox& sandbox, const std::string& reason);

    // SIGTERM: no more creates or refills; once no call runs (or after `grace`), every VM is
    // stopped; `done` runs when the last has ended.
    void drain(std::chrono::milliseconds grace, std::function<void()> done);

    std::string metrics_text() const;

private:
    // A call's outcome, for /metrics (Sandbox::Hooks::on_call_answered).
    void count_call(const Json& answer, double seconds);
    struct Pool {
        PoolConfig config;
        std::deque<Sandbox*> warm;  // ready, not handed out
        unsigned starting = 0;      // refills under way
        unsigned warming = 0;       // ready, running the warm-up call
        unsigned failures_in_row = 0;
        Sandbox::Clock::time_point next_refill{};
        uint64_t created_warm = 0;
        uint64_t created_cold = 0;
    };
    struct Vm {
        std::shared_ptr<Sandbox> sandbox;
        Pool* pool;
        bool refill = false;      // started to become warm, not for a waiting create
        bool low_weight = false;  // started at pool_cpu_weight
        CreateDone waiting;   // the create a cold start is for
        Sandbox::Settings settings;
        Sandbox::Clock::time_point requested{};
        std::string origin;  // the live snapshot it was restored from (held in store_), if any
        std::string outbox;  // where its VMM writes live snapshots (store_->new_outbox()), if any
    };

    Pool* pool_named(const std::string& name);
    // VMs that count against max_sandboxes: all but those on their way out.
    size_t live_vms() const;
    // for_pool: a refill's VM, started at the pool's low CPU weight.
    Vm& start_vm(Pool& pool, bool for_pool);
    void on_ready(Sandbox& sandbox);
    void add_warm(Pool& pool, Sandbox& sandbox);
    void on_exit(Sandbox& sandbox, const std::string& why);
    void hand_out(Vm& vm, Sandbox::Settings settings, Sandbox::Clock::time_point requested, bool warm);
    std::optional<Refusal> admit(Pool& pool);
    void refill();
    void sweep();
    void check_drained();
    void remember_end(const std::string& id, const std::string& reason);
    std::string new_id() const;
    // A pool without a target, for VMs restored from a live snapshot (fork and resume).
    Pool& restore_pool(const std::string& snapshot, const std::string& name);
    // Forgets a restore pool once no VM of it is left.
    void prune_restore_pool(Pool& pool);
    std::optional<Refusal> admit_restores(unsigned count);
    // Asks the sandbox's episode for a live snapshot; `done` gets its path (adopted by
    // store_) or why not.
    void take_snapshot(Sandbox& sandbox, const std::string& kind,
                       std::function<void(const std::string& path, const std::string& error)> done);

    EventLoop& loop_;
    ManagerConfig config_;
    std::map<std::string, Pool> pools_;
    std::map<std::string, Pool> restore_pools_;  // by snapshot path
    std::optional<SnapshotStore> store_;
    std::set<std::string> resuming_;
    std::set<std::string> deleted_while_resuming_;  // of resuming_: DELETEd meanwhile
    std::map<Sandbox*, Vm> vms_;
    std::map<std::string, Sandbox*> by_id_;
    std::map<std::string, std::string> ended_;
    std::deque<std::string> ended_order_;
    std::vector<std::shared_ptr<Sandbox>> graveyard_;  // destroyed on the next turn of the loop
    LoopTimer bury_timer_;
    LoopTimer sweep_timer_;
    LoopTimer drain_timer_;
    bool cpu_weights_ = false;
    bool draining_ = false;
    bool drain_grace_over_ = false;
    std::function<void()> drained_;

    // /metrics
    std::map<std::string, uint64_t> refusals_;  // by code
    std::map<std::string, uint64_t> failures_;  // by kind
    Histogram create_latency_{latency_buckets()};
    Histogram call_latency_{latency_buckets()};
};

} // namespace agentvm
