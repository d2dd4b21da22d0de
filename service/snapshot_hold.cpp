#include "service/snapshot_hold.hpp"

#include <utility>

#include "service/snapshot_store.hpp"

namespace agentvm {

SnapshotHold::SnapshotHold(SnapshotStore& store, std::string path) : store_(&store), path_(std::move(path))
{
    store_->add_hold(path_);
}

SnapshotHold::SnapshotHold(SnapshotHold&& other) noexcept
    : store_(std::exchange(other.store_, nullptr)), path_(std::move(other.path_))
{
}

SnapshotHold& SnapshotHold::operator=(SnapshotHold&& other) noexcept
{
    if (this != &other) {
        release();
        store_ = std::exchange(other.store_, nullptr);
        path_ = std::move(other.path_);
    }
    return *this;
}

SnapshotHold::~SnapshotHold()
{
    release();
}

SnapshotHold SnapshotHold::another() const
{
    return store_ ? SnapshotHold(*store_, path_) : SnapshotHold();
}

void SnapshotHold::release()
{
    if (auto* store = std::exchange(store_, nullptr))
        store->drop_hold(path_);
}

} // namespace agentvm
