// A SnapshotHold owns one reference to one of the store's snapshots: moving it moves the
// reference, dropping the last one removes the snapshot (and what only it held, its parent),
// and a paused sandbox's record keeps its own, which outlives the store on disk.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>

#include "service/snapshot_store.hpp"
#include "tests/support/disk_image.hpp"

using namespace agentvm;
using agentvm::test::TempDir;
namespace fs = std::filesystem;

namespace {

// A snapshot as a VM writes it into its outbox, taken into the store: its one hold.
SnapshotHold take_snapshot(SnapshotStore& store, const std::string& parent = {})
{
    const std::string outbox = store.new_outbox();
    const std::string name = store.new_name("fork", "sb-00");
    fs::create_directories(fs::path(outbox) / name);
    std::ofstream(fs::path(outbox) / name / "manifest.json")
        << (parent.empty() ? std::string("{}") : nlohmann::json{{"parent", {{"dir", parent}}}}.dump());
    SnapshotHold hold = store.take_from_outbox(outbox, name, outbox + "/" + name);
    store.remove_outbox(outbox);
    return hold;
}

} // namespace

TEST_CASE("a hold moves with its owner; the snapshot goes with the last one")
{
    TempDir dir;
    SnapshotStore store(dir.path);
    SnapshotHold first = take_snapshot(store);
    REQUIRE(first);
    const std::string path = first.path();
    CHECK(fs::path(path).parent_path() == fs::path(store.snapshots_dir()));

    SnapshotHold moved = std::move(first);
    CHECK_FALSE(first);  // moved from: it holds nothing
    CHECK(moved.path() == path);
    first = SnapshotHold();  // dropping the moved-from hold releases nothing
    CHECK(fs::exists(path));

    std::optional<SnapshotHold> second(moved.another());
    moved = SnapshotHold();
    CHECK(fs::exists(path));
    second.reset();
    CHECK_FALSE(fs::exists(path));
}

TEST_CASE("a hold assigned over another releases what that one held")
{
    TempDir dir;
    SnapshotStore store(dir.path);
    SnapshotHold hold = take_snapshot(store);
    const std::string replaced = hold.path();
    hold = take_snapshot(store);
    CHECK_FALSE(fs::exists(replaced));
    CHECK(fs::exists(hold.path()));
}

TEST_CASE("a snapshot stored over another holds it until it goes")
{
    TempDir dir;
    SnapshotStore store(dir.path);
    std::optional<SnapshotHold> parent(take_snapshot(store));
    const std::string parent_path = parent->path();
    std::optional<SnapshotHold> child(take_snapshot(store, parent_path));
    parent.reset();
    CHECK(fs::exists(parent_path));
    const std::string child_path = child->path();
    child.reset();
    CHECK_FALSE(fs::exists(child_path));
    CHECK_FALSE(fs::exists(parent_path));
}

TEST_CASE("a paused sandbox's record keeps its snapshot, on disk across the store's end, until removed")
{
    TempDir dir;
    std::string snapshot;
    {
        SnapshotStore store(dir.path);
        SnapshotHold hold = take_snapshot(store);
        snapshot = hold.path();
        PausedSandbox record;
        record.settings.id = "sb-1";
        record.settings.timeout = std::chrono::seconds(60);
        record.settings.env = {{"TASK", "42"}};
        record.pool = "default";
        store.add_paused(record, std::move(hold));
        REQUIRE(store.paused().contains("sb-1"));
        CHECK(store.paused().at("sb-1").snapshot == snapshot);
    }
    CHECK(fs::exists(snapshot));
    SnapshotStore store(dir.path);
    REQUIRE(store.paused().contains("sb-1"));
    const PausedSandbox& record = store.paused().at("sb-1");
    CHECK(record.settings.timeout == std::chrono::seconds(60));
    CHECK(record.settings.env.at("TASK") == "42");
    CHECK(fs::exists(snapshot));
    {
        // What a resume holds while its VM runs: the snapshot outlives the record.
        const SnapshotHold resumed = store.hold(snapshot);
        store.remove_paused("sb-1");
        CHECK(fs::exists(snapshot));
    }
    CHECK_FALSE(fs::exists(snapshot));
}
