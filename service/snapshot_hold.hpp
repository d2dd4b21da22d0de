// One reference to a snapshot of serve's SnapshotStore, owned by whatever needs the snapshot to
// stay: a VM restored from it, a paused sandbox, a fork starting its children. Move-only, so a
// reference is never counted twice or lost: it goes with the object that holds it, and when
// the last hold on a snapshot is dropped the store removes the snapshot (snapshot_store.hpp).
// A hold must not outlive its store.
#pragma once

#include <string>

namespace agentvm {

class SnapshotStore;

class SnapshotHold {
public:
    // Holds nothing.
    SnapshotHold() = default;
    SnapshotHold(SnapshotHold&& other) noexcept;
    SnapshotHold& operator=(SnapshotHold&& other) noexcept;
    SnapshotHold(const SnapshotHold&) = delete;
    SnapshotHold& operator=(const SnapshotHold&) = delete;
    ~SnapshotHold();

    explicit operator bool() const { return store_ != nullptr; }
    // The snapshot's directory under snapshots/.
    const std::string& path() const { return path_; }
    // One more reference to the same snapshot, for another holder.
    SnapshotHold another() const;

private:
    friend class SnapshotStore;
    // Takes one reference on `path` in `store`.
    SnapshotHold(SnapshotStore& store, std::string path);
    void release();

    SnapshotStore* store_ = nullptr;
    std::string path_;
};

} // namespace agentvm
