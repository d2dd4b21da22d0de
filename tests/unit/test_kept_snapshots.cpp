// Kept snapshots (E2B's createSnapshot) in serve's snapshot store: a record in kept/ holds its
// snapshot across serve's restarts until it is deleted, and the settings a facade keeps with a
// sandbox (facade, pause_on_timeout) survive in paused and kept records alike.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/error.hpp"
#include "service/snapshot_store.hpp"

using namespace agentvm;
namespace fs = std::filesystem;

namespace {

struct TempDir {
    fs::path path;
    TempDir()
    {
        std::string pattern = (fs::temp_directory_path() / "agentvm-kept-test-XXXXXX").string();
        REQUIRE(::mkdtemp(pattern.data()) != nullptr);
        path = pattern;
    }
    ~TempDir() { fs::remove_all(path); }
};

// A snapshot taken as a VM's episode leaves one in its outbox.
SnapshotHold take_snapshot(SnapshotStore& store, const std::string& sandbox_id)
{
    const std::string outbox = store.new_outbox();
    const std::string name = store.new_name("keep", sandbox_id);
    fs::create_directories(outbox + "/" + name);
    std::ofstream(outbox + "/" + name + "/manifest.json") << "{}";
    return store.take_from_outbox(outbox, name, outbox + "/" + name);
}

SandboxSettings facade_settings()
{
    SandboxSettings settings;
    settings.timeout = std::chrono::seconds(120);
    settings.env = {{"A", "1"}};
    settings.metadata = nlohmann::json{{"k", "v"}};
    settings.pause_on_timeout = true;
    settings.facade = nlohmann::json{{"e2b", {{"templateID", "base"}, {"alias", "base"}}}};
    return settings;
}

} // namespace

TEST_CASE("a kept snapshot's record holds its snapshot across restarts until removed")
{
    TempDir dir;
    const std::string state = (dir.path / "state").string();
    std::string id;
    std::string snapshot;
    {
        SnapshotStore store(state);
        KeptSnapshot record;
        record.id = id = store.new_kept_id();
        record.names = {"my-snap"};
        record.sandbox_id = "sb-1";
        record.pool = "default";
        record.settings = facade_settings();
        record.created_at_ms = 1234;
        SnapshotHold hold = take_snapshot(store, "sb-1");
        snapshot = hold.path();
        store.add_kept(record, std::move(hold));
        CHECK(store.kept().at(id).snapshot == snapshot);
    }
    CHECK(KeptSnapshot::valid_id(id));
    CHECK(fs::exists(snapshot + "/manifest.json"));
    SnapshotStore store(state);
    REQUIRE(store.kept().contains(id));
    const KeptSnapshot& kept = store.kept().at(id);
    CHECK(kept.names == std::vector<std::string>{"my-snap"});
    CHECK(kept.sandbox_id == "sb-1");
    CHECK(kept.created_at_ms == 1234);
    CHECK(kept.settings.env == facade_settings().env);
    CHECK(kept.settings.facade == facade_settings().facade);
    CHECK(kept.settings.pause_on_timeout);
    CHECK(fs::exists(snapshot + "/manifest.json"));
    // A VM restored from it holds it too: removing the record leaves the snapshot to it.
    SnapshotHold vm = store.hold(snapshot);
    store.remove_kept(id);
    CHECK(store.kept().empty());
    CHECK_FALSE(fs::exists(fs::path(state) / "kept" / (id + ".json")));
    CHECK(fs::exists(snapshot));
    vm = SnapshotHold();
    CHECK_FALSE(fs::exists(snapshot));
}

TEST_CASE("kept records that are not the store's are removed at start")
{
    TempDir dir;
    const fs::path state = dir.path / "state";
    fs::create_directories(state / "kept");
    const nlohmann::json outside{{"id", "snap-0123456789abcdef"}, {"names", nlohmann::json::array()},
                                 {"sandbox_id", "sb-1"}, {"snapshot", (state / "snapshots" / "..").string()},
                                 {"pool", "default"}, {"created_at_ms", 1}, {"timeout", 300},
                                 {"idle_timeout", nullptr}, {"env", nlohmann::json::object()},
                                 {"metadata", nlohmann::json::object()}};
    std::ofstream(state / "kept" / "snap-0123456789abcdef.json") << outside.dump();
    nlohmann::json bad_id = outside;
    bad_id["id"] = "../x";
    std::ofstream(state / "kept" / "x.json") << bad_id.dump();
    SnapshotStore store(state.string());
    CHECK(store.kept().empty());
    CHECK(fs::is_empty(state / "kept"));
}

TEST_CASE("a paused sandbox's record keeps what its facade keeps, and its auto-pause")
{
    PausedSandbox paused;
    paused.settings = facade_settings();
    paused.settings.id = "sb-1";
    paused.snapshot = "/state/snapshots/pause-sb-1-1-1";
    paused.pool = "default";
    const PausedSandbox back = PausedSandbox::from_json(paused.to_json());
    CHECK(back.settings.facade == facade_settings().facade);
    CHECK(back.settings.pause_on_timeout);
    CHECK(back.settings.env == facade_settings().env);

    nlohmann::json not_object = paused.to_json();
    not_object["facade"] = "e2b";
    CHECK_THROWS_AS(PausedSandbox::from_json(not_object), Error);
}

TEST_CASE("kept ids and snapshot names")
{
    CHECK(KeptSnapshot::valid_id("snap-0123456789abcdef"));
    CHECK_FALSE(KeptSnapshot::valid_id("snap-0123456789ABCDEF"));
    CHECK_FALSE(KeptSnapshot::valid_id("snap-0123"));
    CHECK_FALSE(KeptSnapshot::valid_id("sb-0123456789abcdef"));
    CHECK(SnapshotStore::valid_name("keep-sb-1-2-3"));
}
