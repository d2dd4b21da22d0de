// The cancel, stat and list_dir calls on the real agent.
#include "tests/agent/agent_harness.hpp"

using namespace agentvm;
using namespace agentvm::agent_test;

TEST_CASE("cancel kills a running exec call and its process group; a finished or unknown call is not running")
{
    Agent agent;
    Client client(agent);
    const std::string marker = "4000." + std::to_string(::getpid()) + "3";
    client.send({{"id", 1}, {"op", "exec"}, {"argv", {"sh", "-c", "sleep " + marker + "; echo never"}}, {"timeout", 600}});
    REQUIRE(appears(marker));
    // Ids compare as JSON values: "1" is not 1.
    CHECK(client.call({{"id", 2}, {"op", "cancel"}, {"call", "1"}})["running"] == false);
    Json cancel = client.call({{"id", 3}, {"op", "cancel"}, {"call", 1}});
    CHECK(cancel["ok"] == true);
    CHECK(cancel["running"] == true);
    Json cancelled = client.next_line();
    CHECK(cancelled["id"] == 1);
    CHECK(cancelled["cancelled"] == true);
    CHECK(cancelled["signal"] == SIGKILL);
    CHECK(cancelled["timed_out"] == false);
    CHECK(cancelled["oom_killed"] == false);
    CHECK(gone(marker));
    CHECK(client.call({{"id", 4}, {"op", "cancel"}, {"call", 1}})["running"] == false);
    // Only a cancelled call's response has the field.
    CHECK_FALSE(client.exec({{"argv", {"true"}}}).contains("cancelled"));
}

TEST_CASE("cancel of a shell call: a running one takes the shell with it, a waiting one never runs")
{
    Agent agent;
    Client client(agent);
    CHECK(client.call({{"id", 1}, {"op", "shell"}, {"cmd", "cd '" + agent.dir() + "'"}})["exit_code"] == 0);

    client.send({{"id", 2}, {"op", "shell"}, {"cmd", "sleep 0.5"}});
    client.send({{"id", 3}, {"op", "shell"}, {"cmd", "touch never-made"}});
    client.send({{"id", 4}, {"op", "cancel"}, {"call", 3}});
    std::map<int, Json> answers;
    for (int i = 0; i < 3; ++i) {
        Json line = client.next_line();
        answers[line["id"].get<int>()] = line;
    }
    CHECK(answers[4]["running"] == true);
    CHECK(answers[3]["cancelled"] == true);
    CHECK(answers[3]["exit_code"].is_null());
    CHECK(answers[2]["exit_code"] == 0);
    CHECK_FALSE(answers[2].contains("cancelled"));
    CHECK_FALSE(std::filesystem::exists(agent.dir() + "/never-made"));
    // The shell was left as it was.
    CHECK(bytes_of(client.call({{"id", 5}, {"op", "shell"}, {"cmd", "pwd"}}), "stdout") == agent.dir() + "\n");

    client.send({{"id", 6}, {"op", "shell"}, {"cmd", "sleep 30"}});
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK(client.call({{"id", 7}, {"op", "cancel"}, {"call", 6}})["running"] == true);
    Json killed = client.next_line();
    CHECK(killed["id"] == 6);
    CHECK(killed["cancelled"] == true);
    CHECK(killed["signal"] == SIGKILL);
    // A fresh shell: the cd is gone.
    CHECK(bytes_of(client.call({{"id", 8}, {"op", "shell"}, {"cmd", "pwd"}}), "stdout") != agent.dir() + "\n");
}

TEST_CASE("cancel of a run_code cell kills the interpreter")
{
    Agent agent;
    Client client(agent);
    CHECK(client.call({{"id", 1}, {"op", "run_code"}, {"code", "kept = 1"}})["exception"].is_null());
    client.send({{"id", 2}, {"op", "run_code"}, {"code", "import time\ntime.sleep(30)"}});
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    CHECK(client.call({{"id", 3}, {"op", "cancel"}, {"call", 2}})["running"] == true);
    Json cancelled = client.next_line();
    CHECK(cancelled["cancelled"] == true);
    CHECK(cancelled["state_lost"] == true);
    CHECK(cancelled["exception"]["type"] == "InterpreterDied");
    CHECK(client.call({{"id", 4}, {"op", "run_code"}, {"code", "kept"}})["exception"]["type"] == "NameError");
}

TEST_CASE("stat follows symbolic links and reports type, size, mode and mtime")
{
    Agent agent;
    Client client(agent);
    const std::string dir = agent.dir();
    CHECK(client.call({{"id", 1}, {"op", "write_file"}, {"path", dir + "/f.txt"}, {"data", "hello"}, {"mode", "0640"}})["ok"]
          == true);
    REQUIRE(::symlink((dir + "/f.txt").c_str(), (dir + "/link").c_str()) == 0);
    REQUIRE(::symlink((dir + "/nothing").c_str(), (dir + "/dangling").c_str()) == 0);

    for (const char* name : {"/f.txt", "/link"}) {
        Json file = client.call({{"id", 2}, {"op", "stat"}, {"path", dir + name}});
        CHECK(file["ok"] == true);
        CHECK(file["type"] == "file");
        CHECK(file["size"] == 5);
        CHECK(file["mode"] == "0640");
        const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
        CHECK(file["mtime"].get<double>() > now - 600);
        CHECK(file["mtime"].get<double>() <= now + 1);
    }
    CHECK(client.call({{"id", 3}, {"op", "stat"}, {"path", dir}})["type"] == "dir");
    CHECK(client.call({{"id", 4}, {"op", "stat"}, {"path", dir + "/dangling"}})["error"]["code"] == "not_found");
    CHECK(client.call({{"id", 5}, {"op", "stat"}, {"path", dir + "/no/such"}})["error"]["code"] == "not_found");
}

TEST_CASE("list_dir: sorted entries without following links, binary names as base64, bounded by max_entries")
{
    Agent agent;
    Client client(agent);
    const std::string dir = agent.dir() + "/listing";
    REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
    REQUIRE(::mkdir((dir + "/sub").c_str(), 0700) == 0);
    std::ofstream(dir + "/b.txt") << "12345";
    std::ofstream(dir + "/a.txt") << "1";
    REQUIRE(::symlink("a.txt", (dir + "/c-link").c_str()) == 0);
    std::ofstream(dir + "/\xff-binary") << "";

    Json listed = client.call({{"id", 1}, {"op", "list_dir"}, {"path", dir}});
    CHECK(listed["ok"] == true);
    CHECK(listed["truncated"] == false);
    const Json& entries = listed["entries"];
    REQUIRE(entries.size() == 5);
    CHECK(entries[0]["name"] == "a.txt");
    CHECK(entries[0]["size"] == 1);
    CHECK(entries[1]["name"] == "b.txt");
    CHECK(entries[1]["type"] == "file");
    CHECK(entries[1]["size"] == 5);
    CHECK(entries[1]["mode"] == "0644");
    CHECK(entries[2]["name"] == "c-link");
    CHECK(entries[2]["type"] == "symlink");
    CHECK(entries[3]["name"] == "sub");
    CHECK(entries[3]["type"] == "dir");
    CHECK(entries[3]["mode"] == "0700");
    CHECK(bytes_of(entries[4], "name") == "\xff-binary");
    CHECK(entries[4].contains("name_b64"));

    // The first names in sorted order, whatever order the directory keeps them in.
    Json two = client.call({{"id", 2}, {"op", "list_dir"}, {"path", dir}, {"max_entries", 2}});
    CHECK(two["truncated"] == true);
    REQUIRE(two["entries"].size() == 2);
    CHECK(two["entries"][0]["name"] == "a.txt");
    CHECK(two["entries"][1]["name"] == "b.txt");

    CHECK(client.call({{"id", 3}, {"op", "list_dir"}, {"path", dir + "/a.txt"}})["error"]["code"] == "not_found");
    CHECK(client.call({{"id", 4}, {"op", "list_dir"}, {"path", dir + "/none"}})["error"]["code"] == "not_found");
    CHECK(client.call({{"id", 5}, {"op", "list_dir"}, {"path", dir}, {"max_entries", 0}})["error"]["code"] == "bad_field");
}
