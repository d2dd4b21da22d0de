// serve's live snapshots and paused sandboxes on disk (docs/api.md, "Fork, pause and resume"),
// under a state directory that outlives serve:
//   snapshots/NAME      live snapshots the sandboxes' episodes wrote (vmm/snapshot.hpp)
//   paused/ID.json      a paused sandbox: its snapshot and settings, to resume it by its id
//   kept/ID.json        a kept snapshot (E2B's createSnapshot): a running sandbox's snapshot
//                       and settings, which new sandboxes are created from, until deleted
//   outbox/vm-XXXXXX/   one per running VM: the only snapshot directory its jailed VMM can
//                       write, so that a VMM a guest took over reaches no other snapshot
// A VM writes its snapshot into its outbox under a name the store made; the store moves it
// into snapshots/ only when the VM answers with exactly that directory. Every name the store
// takes is one it makes (kind, sandbox id and counters: no '/', '.' or '..'): a guest that
// forges an answer or a manifest cannot name a path outside snapshots/.
// A snapshot stays while something holds it: a VM restored from it, a paused sandbox, a kept
// snapshot's record (each with
// a SnapshotHold, snapshot_hold.hpp), or a snapshot stored over it (its manifest's parent).
// When the last hold goes it is removed, and with it its hold on its parent. At start the
// holds are counted again from what is on disk, and whatever nothing holds (left by a serve
// that was killed) is removed.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/fd.hpp"
#include "service/sandbox_settings.hpp"
#include "service/snapshot_hold.hpp"

namespace agentvm {

// What resuming a paused sandbox needs: the settings it had (its id among them) and the snapshot.
// Of the settings, the record keeps what the user gave: not `warm` and `create_time`, which
// describe one hand-out.
struct PausedSandbox {
    SandboxSettings settings;
    std::string snapshot;  // the directory under snapshots/
    std::string pool;
    int64_t paused_at = 0;     // Unix seconds
    int64_t retain_until = 0;  // Unix seconds: removed after
    uint64_t disk_bytes = 0;   // what its own snapshot stores

    nlohmann::json to_json() const;
    // Throws Error naming the problem.
    static PausedSandbox from_json(const nlohmann::json& j);
};

// A running sandbox's live snapshot kept until it is deleted, which new sandboxes start from
// (E2B's snapshots: created from a sandbox, named in a create as its template). The settings
// are the sandbox's when it was taken (its id cleared): what its new sandboxes inherit.
struct KeptSnapshot {
    std::string id;                  // the store's own: "snap-" and 16 hex digits
    std::vector<std::string> names;  // what its taker called it, if anything
    std::string sandbox_id;          // the sandbox it was taken of
    std::string snapshot;            // the directory under snapshots/
    std::string pool;
    SandboxSettings settings;
    int64_t created_at_ms = 0;  // Unix milliseconds

    nlohmann::json to_json() const;
    // Throws Error naming the problem.
    static KeptSnapshot from_json(const nlohmann::json& j);
    // Whether `id` has the shape of a kept snapshot's id.
    static bool valid_id(std::string_view id);
};

class SnapshotStore {
public:
    // Creates the directories as needed, takes the directory's lock (one serve per state
    // directory), reads the paused sandboxes, counts the holds and removes what nothing holds.
    // Throws Error when the directory cannot be used or another serve holds it.
    explicit SnapshotStore(std::string state_dir);
    // Keeps what is on disk, the paused sandboxes' snapshots included: the next start counts
    // their holds again.
    ~SnapshotStore();
    // Holds point at their store.
    SnapshotStore(const SnapshotStore&) = delete;
    SnapshotStore& operator=(const SnapshotStore&) = delete;

    const std::string& snapshots_dir() const { return snapshots_dir_; }
    // Whether `path` is one of ours (snapshots/NAME with a name of the store's making), which
    // holds apply to.
    bool owns(const std::string& path) const;
    // Whether `name` has the shape of the names new_name() makes.
    static bool valid_name(std::string_view name);

    // A new snapshot's name, for a snapshot of `kind` ("fork", "pause", "keep") of sandbox `id`,
    // unique across serve's restarts. Throws Error if `kind` or `id` would make an invalid one.
    std::string new_name(std::string_view kind, std::string_view id);
    // A fresh, empty directory for one VM's live snapshots (mode 0700). Throws Error.
    std::string new_outbox();
    // Removes a VM's outbox and whatever it left there.
    void remove_outbox(const std::string& outbox);
    // The VM with `outbox` answered that it wrote snapshot `name` at `path`: moved into
    // snapshots/ and adopted (it holds its parent, if that is ours). Returns the one hold on
    // it: dropped, the snapshot is removed. `name` is the one the caller asked the VM for,
    // never one read from its answer. Throws Error when `path` is not that outbox's directory
    // `name`, or that is not a plain directory.
    SnapshotHold take_from_outbox(const std::string& outbox, const std::string& name, const std::string& path);
    // One more hold on a snapshot of ours (a paused sandbox's, for the VM that resumes it); on
    // any other path it holds nothing.
    SnapshotHold hold(const std::string& path);

    const std::map<std::string, PausedSandbox>& paused() const { return paused_; }
    // Writes the record (atomically: a temporary file renamed), its snapshot the one `snapshot`
    // holds, which the record then keeps. Throws Error, and `snapshot` is dropped.
    void add_paused(PausedSandbox record, SnapshotHold snapshot);
    // Removes the record and drops its hold.
    // By value: a caller may pass the id of the very record it removes.
    void remove_paused(std::string id);

    const std::map<std::string, KeptSnapshot>& kept() const { return kept_; }
    // As add_paused, for a kept snapshot (its id already set: new_kept_id()).
    void add_kept(KeptSnapshot record, SnapshotHold snapshot);
    void remove_kept(std::string id);
    // A fresh id for a kept snapshot. Throws Error when no random bytes can be had.
    std::string new_kept_id() const;

    // Bytes of data a snapshot's files store (a sparse file's allocated blocks).
    static uint64_t stored_bytes(const std::string& path);

private:
    friend class SnapshotHold;
    // A snapshot's count of holds, by its path: only SnapshotHold and a snapshot's own hold on
    // its parent change it.
    void add_hold(const std::string& path);
    // At none the snapshot is removed, and its own hold on its parent dropped.
    void drop_hold(const std::string& path);
    std::optional<std::string> parent_of(const std::string& path) const;
    // Whether a record's snapshot is one of ours and still there.
    bool usable(const std::string& snapshot) const;
    // Each record file in `dir`, parsed, to `take`; one that cannot be read, or that `take`
    // throws for, is removed, logged as a `what`'s.
    static void for_each_record(const std::string& dir, const char* what,
                                const std::function<void(const std::filesystem::path&, const nlohmann::json&)>& take);
    // A snapshot just taken in: it holds its parent, if that is ours.
    void adopt(const std::string& path);

    Fd lock_;
    std::string paused_dir_;
    std::string kept_dir_;
    std::string snapshots_dir_;
    std::string outbox_dir_;
    uint64_t names_made_ = 0;
    std::map<std::string, int> holds_;
    std::map<std::string, PausedSandbox> paused_;
    std::map<std::string, SnapshotHold> paused_holds_;  // by id: each paused sandbox's snapshot
    std::map<std::string, KeptSnapshot> kept_;
    std::map<std::string, SnapshotHold> kept_holds_;  // by id: each kept snapshot's
};

} // namespace agentvm
