// A call's "user" (docs/protocol.md, "A call's user"): exec and spawn run as a user of the
// guest's /etc/passwd, with its groups, HOME, USER and LOGNAME and its home as the default
// cwd; the file calls act with its file credentials. The agent reads a passwd and group of
// the test's (--accounts) instead of the host's. Needs root, as the agent in the guest has.
#include "tests/agent/agent_harness.hpp"

using namespace agentvm;
using namespace agentvm::agent_test;

namespace call_user_test {

constexpr uid_t tester_uid = 4321;
constexpr gid_t tester_gid = 4322;
constexpr gid_t extra_gid = 4323;

// The --accounts directory: root, "tester" (its own group, and a member of "extra") whose
// home is made here and is its own, and an entry whose uid is no number.
struct Accounts {
    std::string dir;
    std::string home;

    Accounts()
    {
        dir = make_temp_dir();
        // The user must get through to its home.
        REQUIRE(::chmod(dir.c_str(), 0711) == 0);
        REQUIRE(::mkdir((dir + "/home").c_str(), 0711) == 0);
        home = dir + "/home/tester";
        REQUIRE(::mkdir(home.c_str(), 0750) == 0);
        REQUIRE(::chown(home.c_str(), tester_uid, tester_gid) == 0);
        std::ofstream(dir + "/passwd") << "root:x:0:0:root:/root:/bin/bash\n"
                                       << "tester:x:4321:4322:Tester,,,:" << home << ":/bin/bash\n"
                                       << "broken:x:many:4322::/:/bin/sh\n"
                                       << "tester:x:9999:9999:a later entry of the same name:/:/bin/sh\n";
        std::ofstream(dir + "/group") << "root:x:0:\n"
                                      << "tester:x:4322:\n"
                                      << "extra:x:4323:someone,tester\n"
                                      << "others:x:4324:someone,testers\n";
    }
    ~Accounts() { std::filesystem::remove_all(dir); }
};

std::string out(const Json& answer)
{
    REQUIRE_MESSAGE(!answer.contains("error"), answer.dump());
    return bytes_of(answer, "stdout");
}

std::string error_code(const Json& answer)
{
    return answer.contains("error") ? answer["error"]["code"].get<std::string>() : "";
}

std::string error_message(const Json& answer)
{
    return answer.contains("error") ? answer["error"]["message"].get<std::string>() : "";
}

bool ok(const Json& answer)
{
    return answer.value("ok", false);
}

struct stat stat_of(const std::string& path)
{
    struct stat st {};
    REQUIRE_MESSAGE(::lstat(path.c_str(), &st) == 0, path);
    return st;
}

// What a spawned process wrote (its pipe's or its terminal's), attached to until it ended.
std::string output_of_spawned(Client& client, int id, const Json& spawn)
{
    const Json started = client.call(spawn);
    REQUIRE_MESSAGE(ok(started), started.dump());
    std::vector<Json> events;
    const Json end = client.call({{"id", id}, {"op", "attach"}, {"pid", started["pid"]}}, &events);
    CHECK_MESSAGE(end["exit_code"] == 0, end.dump());
    std::string output;
    for (const Json& event : events)
        if (event["event"] == "stdout" || event["event"] == "pty")
            output += bytes_of(event, "data");
    return output;
}

// The user cannot reach tools under /root (a pyenv's python3): the system's, as in a guest.
struct SystemPath {
    std::string host = std::getenv("PATH") ? std::getenv("PATH") : "";
    SystemPath() { ::setenv("PATH", "/usr/local/bin:/usr/bin:/bin", 1); }
    ~SystemPath() { ::setenv("PATH", host.c_str(), 1); }
};

TEST_CASE("exec and spawn as a named user: its ids and groups, HOME, USER and LOGNAME, its home as the cwd")
{
    REQUIRE_MESSAGE(::geteuid() == 0, "the agent tests run as root, as the agent in the guest does");
    const Accounts accounts;
    // The image's user, which a named user replaces for its call.
    const UserFile image_user("65534:65533\n");
    std::optional<Agent> started;
    {
        const SystemPath system_path;
        started.emplace(0, image_user.file(), 0, accounts.dir);
    }
    Agent& agent = *started;
    Client client(agent);
    auto exec_as = [&](const std::string& user, const std::string& script, Json extra = Json::object()) {
        extra["argv"] = {"sh", "-c", script};
        extra["user"] = user;
        return client.exec(extra);
    };

    CHECK(out(exec_as("tester", "id -u; id -g; id -G")) == "4321\n4322\n4322 4323\n");
    CHECK(out(exec_as("tester", "echo \"$HOME $USER $LOGNAME\"; pwd"))
          == accounts.home + " tester tester\n" + accounts.home + "\n");
    CHECK(out(exec_as("tester", "pwd", {{"cwd", "/"}})) == "/\n");
    // The request's env wins over what the user brings.
    CHECK(out(exec_as("tester", "echo $HOME", {{"env", {{"HOME", "/elsewhere"}}}})) == "/elsewhere\n");
    // The home is the user's: what the command makes there is too.
    CHECK(out(exec_as("tester", "touch made && stat -c '%u %g' made")) == "4321 4322\n");
    // Root while the image names another user; without "user", the image's as before.
    CHECK(out(exec_as("root", "id -u; id -G; echo $HOME $USER; pwd")) == "0\n0\n/root root\n/root\n");
    CHECK(out(client.exec({{"argv", {"id", "-u"}}})) == "65534\n");

    const std::string spawned = output_of_spawned(
        client, 101,
        {{"id", 100}, {"op", "spawn"}, {"argv", {"sh", "-c", "id -u; pwd; echo $USER"}}, {"user", "tester"}});
    CHECK(spawned == "4321\n" + accounts.home + "\ntester\n");
    // A terminal of the user's, which it may open again.
    const std::string on_pty = output_of_spawned(client, 103,
                                                 {{"id", 102},
                                                  {"op", "spawn"},
                                                  {"argv", {"sh", "-c", "id -u; stat -c %u \"$(tty)\""}},
                                                  {"pty", {{"rows", 24}, {"cols", 80}}},
                                                  {"user", "tester"}});
    CHECK(on_pty == "4321\r\n4321\r\n");
}

TEST_CASE("an unknown user is bad_field naming it, for commands and file calls alike")
{
    REQUIRE_MESSAGE(::geteuid() == 0, "the agent tests run as root, as the agent in the guest does");
    const Accounts accounts;
    Agent agent(0, "", 0, accounts.dir);
    Client client(agent);
    const std::vector<Json> refused{
        client.call({{"id", 1}, {"op", "exec"}, {"argv", {"true"}}, {"user", "nosuch"}}),
        client.call({{"id", 2}, {"op", "spawn"}, {"argv", {"true"}}, {"user", "nosuch"}}),
        client.call({{"id", 3}, {"op", "stat"}, {"path", "/"}, {"user", "nosuch"}}),
        client.call({{"id", 4}, {"op", "list_dir"}, {"path", "/"}, {"user", "nosuch"}}),
        client.call({{"id", 5}, {"op", "make_dir"}, {"path", agent.dir() + "/d"}, {"user", "nosuch"}}),
        client.call({{"id", 6}, {"op", "read_file"}, {"path", accounts.dir + "/passwd"}, {"user", "nosuch"}}),
        client.call({{"id", 7}, {"op", "write_file"}, {"path", agent.dir() + "/f"}, {"data", ""}, {"user", "nosuch"}}),
        client.call({{"id", 8}, {"op", "watch"}, {"path", agent.dir()}, {"user", "nosuch"}}),
    };
    for (const Json& answer : refused) {
        CHECK_MESSAGE(error_code(answer) == "bad_field", answer.dump());
        CHECK_MESSAGE(error_message(answer) == "no user \"nosuch\" in the guest's /etc/passwd", answer.dump());
    }
    CHECK_FALSE(std::filesystem::exists(agent.dir() + "/d"));
    CHECK_FALSE(std::filesystem::exists(agent.dir() + "/f"));
    // A group's name is no user; an entry whose uid is no number is none either, and the first
    // entry of a name is the one that counts.
    CHECK(error_code(client.exec({{"argv", {"true"}}, {"user", "extra"}})) == "bad_field");
    CHECK(error_code(client.exec({{"argv", {"true"}}, {"user", "broken"}})) == "bad_field");
    CHECK(out(client.exec({{"argv", {"id", "-u"}}, {"user", "tester"}})) == "4321\n");
}

TEST_CASE("file calls as a named user: its permissions, what it makes is its own, root's calls unchanged")
{
    REQUIRE_MESSAGE(::geteuid() == 0, "the agent tests run as root, as the agent in the guest does");
    const Accounts accounts;
    Agent agent(0, "", 0, accounts.dir);
    Client client(agent);
    // Root's, for root alone; the agent's directory the user can pass through.
    REQUIRE(::chmod(agent.dir().c_str(), 0711) == 0);
    const std::string closed = agent.dir() + "/root-only";
    REQUIRE(::mkdir(closed.c_str(), 0700) == 0);
    std::ofstream(closed + "/file") << "root's";
    const std::string home = accounts.home;
    const Json tester = "tester";

    CHECK(ok(client.call({{"id", 1}, {"op", "make_dir"}, {"path", home + "/a/b"}, {"user", tester}})));
    CHECK(stat_of(home + "/a/b").st_uid == tester_uid);
    CHECK(stat_of(home + "/a").st_gid == tester_gid);
    const Json written = client.call(
        {{"id", 2}, {"op", "write_file"}, {"path", home + "/a/f.txt"}, {"data", "mine"}, {"user", tester}});
    REQUIRE_MESSAGE(ok(written), written.dump());
    CHECK(stat_of(home + "/a/f.txt").st_uid == tester_uid);
    CHECK(stat_of(home + "/a/f.txt").st_gid == tester_gid);
    std::vector<Json> events;
    const Json read = client.call({{"id", 3}, {"op", "read_file"}, {"path", home + "/a/f.txt"}, {"user", tester}},
                                  &events);
    REQUIRE_MESSAGE(ok(read), read.dump());
    REQUIRE(events.size() == 1);
    CHECK(bytes_of(events[0], "data") == "mine");
    const Json described = client.call({{"id", 4}, {"op", "stat"}, {"path", home + "/a"}, {"user", tester}});
    CHECK(described["owner"] == "tester");  // the name from the same passwd
    CHECK(described["group"] == "tester");
    CHECK(ok(client.call({{"id", 5}, {"op", "move"}, {"from", home + "/a/f.txt"}, {"to", home + "/g.txt"}, {"user", tester}})));
    CHECK(ok(client.call({{"id", 6}, {"op", "remove"}, {"path", home + "/a"}, {"recursive", true}, {"user", tester}})));
    CHECK_FALSE(std::filesystem::exists(home + "/a"));

    const std::vector<Json> refused{
        client.call({{"id", 10}, {"op", "make_dir"}, {"path", closed + "/x"}, {"user", tester}}),
        client.call({{"id", 11}, {"op", "stat"}, {"path", closed + "/file"}, {"user", tester}}),
        client.call({{"id", 12}, {"op", "list_dir"}, {"path", closed}, {"user", tester}}),
        client.call({{"id", 13}, {"op", "remove"}, {"path", closed + "/file"}, {"user", tester}}),
        client.call({{"id", 14}, {"op", "move"}, {"from", closed + "/file"}, {"to", home + "/stolen"}, {"user", tester}}),
        client.call({{"id", 15}, {"op", "watch"}, {"path", closed}, {"user", tester}}),
        client.call({{"id", 16}, {"op", "read_file"}, {"path", closed + "/file"}, {"user", tester}}),
        client.call({{"id", 17}, {"op", "write_file"}, {"path", closed + "/new"}, {"data", "x"}, {"user", tester}}),
        client.call({{"id", 18}, {"op", "write_file"}, {"path", closed + "/file"}, {"data", "x"}, {"user", tester}}),
    };
    for (const Json& answer : refused) {
        CHECK_MESSAGE(error_code(answer) == "io", answer.dump());
        CHECK_MESSAGE(error_message(answer).find("Permission denied") != std::string::npos, answer.dump());
    }
    CHECK_FALSE(std::filesystem::exists(closed + "/new"));

    // Root's: by name, or with no user at all (no image user here), on the same thread as before.
    std::vector<Json> root_events;
    const Json as_root = client.call({{"id", 20}, {"op", "read_file"}, {"path", closed + "/file"}, {"user", "root"}},
                                     &root_events);
    CHECK_MESSAGE(ok(as_root), as_root.dump());
    CHECK(ok(client.call({{"id", 21}, {"op", "list_dir"}, {"path", closed}})));
    const Json root_write = client.call({{"id", 22}, {"op", "write_file"}, {"path", closed + "/w"}, {"data", "r"}});
    CHECK_MESSAGE(ok(root_write), root_write.dump());
    CHECK(stat_of(closed + "/w").st_uid == 0);
    CHECK(ok(client.call({{"id", 23}, {"op", "make_dir"}, {"path", closed + "/d"}, {"user", "root"}})));
    CHECK(stat_of(closed + "/d").st_uid == 0);
}

} // namespace call_user_test
