// Fork, pause and resume (docs/api.md): sandboxes from a running sandbox's live snapshot, and
// paused sandboxes, whose snapshot and settings are on disk (SnapshotStore) until they run
// again under their id; and kept snapshots (E2B's), a running sandbox's live snapshot on disk
// until deleted, which creates name to start from. Every snapshot in use is held by what uses
// it (SnapshotHold): the fork while it starts its children, each VM restored from it, each
// paused sandbox, each kept snapshot.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "service/admission.hpp"
#include "service/pools.hpp"
#include "service/problem.hpp"
#include "service/sandbox.hpp"
#include "service/snapshot_store.hpp"

namespace agentvm {

// Called once: with the sandbox, ready and handed out, or with why there is none.
using CreateDone = std::function<void(Sandbox* sandbox, const Refusal* refusal)>;

class SandboxSnapshots {
public:
    // What fork, pause and resume need of the sandboxes serve runs (SandboxManager).
    class Registry {
    public:
        virtual std::shared_ptr<Sandbox> find(const std::string& id) = 0;
        // Ends a sandbox now: gone from the list, its end remembered, its VM stopped.
        virtual void remove(Sandbox& sandbox, const std::string& reason) = 0;
        // Only drops `id` from the list: its end is remembered already.
        virtual void unlist(const std::string& id) = 0;
        virtual void remember_end(const std::string& id, const std::string& reason) = 0;
        virtual void forget_end(const std::string& id) = 0;
        // Where the sandbox's VM writes its live snapshots.
        virtual const std::string& outbox_of(Sandbox& sandbox) const = 0;
        // Starts a VM of `pool` (restored from what `origin` holds, which it keeps), handed
        // out with `settings` once ready (a new id unless they have one). Throws Error.
        virtual void start_for(Pool& pool, Sandbox::Settings settings, Sandbox::Clock::time_point requested,
                               SnapshotHold origin, CreateDone done) = 0;

    protected:
        ~Registry() = default;
    };

    // Without a state_dir there is no store: fork, pause and resume are refused `unavailable`.
    SandboxSnapshots(const std::string& state_dir, std::chrono::seconds paused_retention, Registry& registry,
                     Pools& pools, Admission& admission);
    SandboxSnapshots(const SandboxSnapshots&) = delete;
    SandboxSnapshots& operator=(const SandboxSnapshots&) = delete;

    // A new VM's outbox, the only directory of the state directory its jail keeps writable
    // (none without a store), and its removal once the VM has ended.
    std::string new_outbox();
    void remove_outbox(const std::string& outbox);

    // Each calls `done` once. fork: `count` new sandboxes from a live snapshot of `parent`,
    // which runs on, with its settings and new ids, once all of them are ready (if one
    // fails, the others are removed and the fork refused).
    using ForkDone = std::function<void(const std::vector<Sandbox*>& children, const Refusal* refusal)>;
    void fork(Sandbox& parent, unsigned count, ForkDone done);
    // pause: the sandbox's live snapshot and settings go to disk and its VM ends; it is then
    // listed as paused under its id until resumed, deleted or past its retention. A sandbox
    // with calls running is refused `busy` (their answers would be lost), unless `end_calls`:
    // those calls then end `stopped` with the VM, as E2B's pause cuts its connections.
    using PauseDone = std::function<void(const PausedSandbox* paused, const Refusal* refusal)>;
    void pause(Sandbox& sandbox, PauseDone done, bool end_calls = false);
    // resume: the paused sandbox runs again from its snapshot, under the same id.
    void resume(const std::string& id, CreateDone done);

    // keep: a live snapshot of `sandbox`, which runs on, kept with its settings under a new id
    // until remove_kept (`names`: what the taker called it).
    using KeepDone = std::function<void(const KeptSnapshot* kept, const Refusal* refusal)>;
    void keep(Sandbox& sandbox, std::vector<std::string> names, KeepDone done);
    // A new sandbox from kept snapshot `id`, handed out with `settings` (a new id).
    void create_from_kept(const std::string& id, Sandbox::Settings settings, CreateDone done);
    const KeptSnapshot* find_kept(const std::string& id) const;
    std::vector<const KeptSnapshot*> kept() const;
    // Whether there was one. VMs restored from it run on: each holds the snapshot.
    bool remove_kept(const std::string& id);

    const PausedSandbox* find_paused(const std::string& id) const;
    std::vector<const PausedSandbox*> paused() const;
    // By value: a caller may pass the id of the very record it removes.
    void remove_paused(std::string id, const std::string& reason);
    // Removes the paused sandboxes past their retention at `now`, but those being resumed.
    void expire_paused(std::chrono::system_clock::time_point now);

private:
    std::optional<Refusal> admit_restores(unsigned count) const;
    // Asks the sandbox's episode for a live snapshot; `done` gets the one hold on it, or
    // nothing and why.
    using SnapshotTaken = std::function<void(SnapshotHold snapshot, const std::string& error)>;
    void take_snapshot(Sandbox& sandbox, const std::string& kind, SnapshotTaken done);

    std::chrono::seconds paused_retention_;
    Registry& registry_;
    Pools& pools_;
    Admission& admission_;
    std::optional<SnapshotStore> store_;
    std::set<std::string> resuming_;
    std::set<std::string> deleted_while_resuming_;  // of resuming_: DELETEd meanwhile
};

} // namespace agentvm
