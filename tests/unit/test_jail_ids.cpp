// serve's VM users (service/vm_users/): --jail-uid-range's parsing and its checks, the ids
// handed out and taken back, and the directories shared with a VM and taken back from it
// (these as root, as serve with its VM users runs: chown to another uid needs CAP_CHOWN).
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/error.hpp"
#include "common/share_with_vm.hpp"
#include "service/vm_users/jail_ids.hpp"
#include "service/vm_users/subordinate_ids.hpp"
#include "service/vm_users/vm_dir_sharing.hpp"

using namespace agentvm;
namespace fs = std::filesystem;

namespace {

std::string error_of(const std::string& text)
{
    try {
        parse_jail_id_range(text);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

struct TempDir {
    fs::path path;
    TempDir()
    {
        char name[] = "/tmp/agentvm-jail-ids-XXXXXX";
        REQUIRE(::mkdtemp(name) != nullptr);
        path = name;
    }
    ~TempDir() { fs::remove_all(path); }
};

struct stat stat_of(const fs::path& path)
{
    struct stat st {};
    REQUIRE(::lstat(path.c_str(), &st) == 0);
    return st;
}

constexpr uid_t vm_uid = 1879048192 + 7;

} // namespace

TEST_CASE("--jail-uid-range: FIRST:COUNT or none, never root, never past 2^31 - 1")
{
    const auto range = parse_jail_id_range("1879048192:65536");
    REQUIRE(range);
    CHECK(range->first == 1879048192u);
    CHECK(range->count == 65536u);
    CHECK_FALSE(parse_jail_id_range("none"));
    CHECK(error_of("1000").find("FIRST:COUNT") != std::string::npos);
    CHECK(error_of("a:5").find("FIRST:COUNT") != std::string::npos);
    CHECK(error_of("5:").find("FIRST:COUNT") != std::string::npos);
    CHECK(error_of("-1:5").find("FIRST:COUNT") != std::string::npos);
    CHECK(error_of("0:10").find("root") != std::string::npos);
    CHECK(error_of("10:0").find("empty") != std::string::npos);
    CHECK(error_of("2147483647:2").find("2147483647") != std::string::npos);
    CHECK(error_of("2147483647:1").empty());
}

TEST_CASE("a range holding a user or group of the host is refused, naming it; the default holds none")
{
    CHECK_NOTHROW(check_no_accounts_in(default_jail_id_range));
    // uid and gid 1, daemon, on every Debian host.
    try {
        check_no_accounts_in({1, 1});
        FAIL("uid 1 was not found");
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find("(uid 1)") != std::string::npos);
    }
}

TEST_CASE("a range overlapping /etc/subuid's or /etc/subgid's delegations is refused, naming the line and owner")
{
    TempDir dir;
    const fs::path subuid = dir.path / "subuid";
    std::ofstream(subuid) << "# a comment\n"
                             "alice:100000:65536\n"
                             "not a delegation\n"
                             "empty:300000:0\n"
                             "bob:165536:65536";
    const auto error_for = [&](JailIdRange range) -> std::string {
        try {
            check_no_subordinate_ids_in(range, subuid.string());
        } catch (const Error& e) {
            return e.what();
        }
        return "";
    };
    CHECK(error_for({1000, 99000}) == "");
    CHECK(error_for({231072, 10}) == "");
    CHECK(error_for({300000, 10}) == "");  // a delegation of no ids holds none
    const std::string inside_alice = error_for({100000, 1});
    CHECK(inside_alice.find("line 2") != std::string::npos);
    CHECK(inside_alice.find("alice") != std::string::npos);
    CHECK(inside_alice.find("100000 to 165535") != std::string::npos);
    CHECK(error_for({99999, 2}).find("alice") != std::string::npos);
    const std::string bob_last = error_for({231071, 5});
    CHECK(bob_last.find("line 5") != std::string::npos);
    CHECK(bob_last.find("bob") != std::string::npos);
    CHECK(error_for({1, 4000000000u}).find("alice") != std::string::npos);

    CHECK_NOTHROW(check_no_subordinate_ids_in({100000, 1}, (dir.path / "missing").string()));
    CHECK_THROWS_WITH_AS(check_no_subordinate_ids_in({100000, 1}, dir.path.string()),
                         doctest::Contains("cannot read"), Error);
    std::ofstream(dir.path / "huge").seekp((16 << 20) + 1) << 'x';
    CHECK_THROWS_WITH_AS(check_no_subordinate_ids_in({100000, 1}, (dir.path / "huge").string()),
                         doctest::Contains("larger than 16 MiB"), Error);
}

TEST_CASE("ids: every id never used before one given back, then those given back in order, then none")
{
    JailIds ids({100, 3});
    CHECK(ids.take() == 100u);
    CHECK(ids.take() == 101u);
    ids.give_back(100);
    CHECK(ids.take() == 102u);
    ids.give_back(102);
    CHECK(ids.take() == 100u);
    CHECK(ids.take() == 102u);
    CHECK(ids.in_use() == 3);
    CHECK_FALSE(ids.take());
    ids.give_back(101);
    CHECK(ids.in_use() == 2);
    CHECK(ids.take() == 101u);
}

TEST_CASE("a shared directory gets the VM's group and mode; a tree taken back is serve's, its links not followed")
{
    REQUIRE(::geteuid() == 0);
    TempDir dir;
    share_with_vm(dir.path, vm_uid, 0770);
    CHECK(stat_of(dir.path).st_gid == vm_uid);
    CHECK((stat_of(dir.path).st_mode & 07777) == 0770);
    CHECK_THROWS_AS(share_with_vm((dir.path / "gone").string(), vm_uid, 0770), Error);

    // As a VMM of uid vm_uid leaves a snapshot, with a link to a file outside it.
    TempDir outside;
    const fs::path victim = outside.path / "victim";
    std::ofstream(victim) << "not the VM's";
    REQUIRE(::chown(victim.c_str(), vm_uid, vm_uid) == 0);
    const fs::path snapshot = dir.path / "snap";
    fs::create_directories(snapshot / "inner");
    std::ofstream(snapshot / "memory") << "bytes";
    std::ofstream(snapshot / "inner" / "state") << "bytes";
    fs::create_symlink(victim, snapshot / "link");
    for (const fs::path& path : {snapshot, snapshot / "inner", snapshot / "memory", snapshot / "inner" / "state"})
        REQUIRE(::chown(path.c_str(), vm_uid, vm_uid) == 0);
    REQUIRE(::lchown((snapshot / "link").c_str(), vm_uid, vm_uid) == 0);

    reclaim_tree(snapshot.string());
    for (const fs::path& path :
         {snapshot, snapshot / "inner", snapshot / "memory", snapshot / "inner" / "state", snapshot / "link"}) {
        CAPTURE(path);
        CHECK(stat_of(path).st_uid == 0);
        CHECK(stat_of(path).st_gid == 0);
    }
    CHECK(stat_of(victim).st_uid == vm_uid);
    CHECK_NOTHROW(reclaim_tree((dir.path / "gone").string()));

    fs::path deep = dir.path / "deep";
    for (int level = 0; level < 6; ++level)
        deep /= "d";
    fs::create_directories(deep);
    CHECK_THROWS_WITH_AS(reclaim_tree((dir.path / "deep").string()), doctest::Contains("deeper than any snapshot"),
                         Error);
}
