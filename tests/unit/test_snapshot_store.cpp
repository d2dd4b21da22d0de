// serve's snapshot store against what a hostile guest can put in a VM's answers and in the
// snapshots its VMM writes: only names the store made, only the directory it asked for, and
// nothing outside snapshots/ ever removed.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
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
        std::string pattern = (fs::temp_directory_path() / "agentvm-store-test-XXXXXX").string();
        REQUIRE(::mkdtemp(pattern.data()) != nullptr);
        path = pattern;
    }
    ~TempDir() { fs::remove_all(path); }
};

void write_text(const fs::path& path, const std::string& text)
{
    std::ofstream out(path, std::ios::binary);
    out << text;
}

// A snapshot directory as an episode leaves it: a manifest naming `parent` (none if empty).
void make_snapshot(const fs::path& dir, const std::string& parent = {})
{
    fs::create_directories(dir);
    write_text(dir / "manifest.json",
               parent.empty() ? std::string("{}") : nlohmann::json{{"parent", {{"dir", parent}}}}.dump());
    write_text(dir / "memory", "pages");
}

// What a state directory holds outside snapshots/ that must survive anything a guest does.
void make_bystanders(const fs::path& state)
{
    write_text(state / "paused" / "bystander.txt", "another tenant's");
    write_text(state / "precious", "outside snapshots/");
}

void check_bystanders(const fs::path& state)
{
    CHECK(fs::exists(state / "lock"));
    CHECK(fs::exists(state / "precious"));
    CHECK(fs::exists(state / "paused" / "bystander.txt"));
    CHECK(fs::is_directory(state / "snapshots"));
}

} // namespace

TEST_CASE("snapshot names: only the shape the store makes")
{
    for (const char* bad : {"", ".", "..", "fork-..", "fork-a/b", "pause-A", "other-1", "fork-1.partial-x",
                            "fork-\xff"})
        CHECK_MESSAGE(!SnapshotStore::valid_name(bad), bad);
    TempDir dir;
    SnapshotStore store(dir.path.string());
    const std::string name = store.new_name("fork", "sb-0123456789abcdef");
    CHECK(SnapshotStore::valid_name(name));
    CHECK(store.new_name("fork", "sb-0123456789abcdef") != name);
    CHECK_THROWS_AS(store.new_name("fork", "../up"), Error);
    CHECK(store.owns(store.snapshots_dir() + "/" + name));
    CHECK_FALSE(store.owns(store.snapshots_dir() + "/.."));
    CHECK_FALSE(store.owns(store.snapshots_dir() + "/."));
    CHECK_FALSE(store.owns(dir.path.string() + "/" + name));
}

TEST_CASE("a VM's snapshot is taken only from its own outbox, under the name it was asked for")
{
    TempDir dir;
    const fs::path state = dir.path / "state";
    SnapshotStore store(state.string());
    make_bystanders(state);
    const std::string outbox = store.new_outbox();
    CHECK(fs::is_directory(outbox));
    CHECK((fs::status(outbox).permissions() & fs::perms::all) == fs::perms::owner_all);
    const std::string other_outbox = store.new_outbox();
    CHECK(other_outbox != outbox);
    const std::string name = store.new_name("pause", "sb-00");
    make_snapshot(fs::path(outbox) / name);

    // Whatever the answer names, only OUTBOX/NAME is taken.
    for (const std::string& forged :
         {store.snapshots_dir() + "/..", store.snapshots_dir() + "/.", outbox + "/..", outbox + "/" + name + "/..",
          other_outbox + "/" + name, state.string(), std::string("/")})
        CHECK_THROWS_AS(store.take_from_outbox(outbox, name, forged), Error);
    // A name the store did not make is refused, even where the path agrees.
    make_snapshot(fs::path(outbox) / "..");
    CHECK_THROWS_AS(store.take_from_outbox(outbox, "..", outbox + "/.."), Error);
    // A symlink in place of the directory is refused.
    const std::string linked = store.new_name("pause", "sb-00");
    fs::create_directory_symlink(state, fs::path(outbox) / linked);
    CHECK_THROWS_AS(store.take_from_outbox(outbox, linked, outbox + "/" + linked), Error);

    std::optional<SnapshotHold> hold = store.take_from_outbox(outbox, name, outbox + "/" + name);
    const std::string taken = hold->path();
    CHECK(taken == store.snapshots_dir() + "/" + name);
    CHECK(fs::exists(fs::path(taken) / "manifest.json"));
    CHECK_FALSE(fs::exists(fs::path(outbox) / name));
    hold.reset();
    CHECK_FALSE(fs::exists(taken));
    store.remove_outbox(outbox);
    store.remove_outbox(state.string());  // not an outbox: left alone
    CHECK_FALSE(fs::exists(outbox));
    check_bystanders(state);
}

TEST_CASE("a manifest naming a parent outside snapshots/ holds nothing and removes nothing")
{
    TempDir dir;
    const fs::path state = dir.path / "state";
    SnapshotStore store(state.string());
    make_bystanders(state);
    const std::string outbox = store.new_outbox();
    for (const std::string& parent : {store.snapshots_dir() + "/..", store.snapshots_dir() + "/.",
                                      store.snapshots_dir(), state.string() + "/paused", std::string("/")}) {
        const std::string name = store.new_name("fork", "sb-00");
        make_snapshot(fs::path(outbox) / name, parent);
        std::string taken;
        {
            const SnapshotHold hold = store.take_from_outbox(outbox, name, outbox + "/" + name);
            taken = hold.path();
        }
        CHECK_FALSE(fs::exists(taken));
        check_bystanders(state);
    }
}

TEST_CASE("at start: what serve did not make is removed from snapshots/ without following links")
{
    TempDir dir;
    const fs::path state = dir.path / "state";
    const fs::path victim = dir.path / "victim";
    fs::create_directories(victim);
    write_text(victim / "keep", "a host file");
    fs::create_directories(state / "snapshots");
    fs::create_directories(state / "paused");
    fs::create_directories(state / "outbox" / "vm-left");
    fs::create_directory_symlink(victim, state / "snapshots" / "fork-planted");
    make_snapshot(state / "snapshots" / "not-ours");
    make_snapshot(state / "snapshots" / "fork-held");
    write_text(state / "paused" / "sb-1.json",
               nlohmann::json{{"id", "sb-1"}, {"snapshot", (state / "snapshots" / "fork-held").string()},
                              {"pool", "default"}, {"timeout", 300}, {"idle_timeout", nullptr},
                              {"env", nlohmann::json::object()}, {"metadata", nlohmann::json::object()},
                              {"paused_at", 1}, {"retain_until", 2}, {"disk_bytes", 0}}
                   .dump());
    // A record whose snapshot is outside snapshots/ is unusable, and its target left alone.
    write_text(state / "paused" / "sb-2.json",
               nlohmann::json{{"id", "sb-2"}, {"snapshot", (state / "snapshots" / "..").string()},
                              {"pool", "default"}, {"timeout", 300}, {"idle_timeout", nullptr},
                              {"env", nlohmann::json::object()}, {"metadata", nlohmann::json::object()},
                              {"paused_at", 1}, {"retain_until", 2}, {"disk_bytes", 0}}
                   .dump());
    SnapshotStore store(state.string());
    CHECK(store.paused().size() == 1);
    CHECK(store.paused().contains("sb-1"));
    CHECK_FALSE(fs::exists(state / "paused" / "sb-2.json"));
    CHECK(fs::exists(state / "snapshots" / "fork-held" / "manifest.json"));
    CHECK_FALSE(fs::exists(fs::symlink_status(state / "snapshots" / "fork-planted")));
    CHECK_FALSE(fs::exists(state / "snapshots" / "not-ours"));
    CHECK(fs::exists(victim / "keep"));
    CHECK(fs::is_directory(state / "outbox"));
    CHECK(fs::is_empty(state / "outbox"));
    CHECK(fs::exists(state / "lock"));
}
