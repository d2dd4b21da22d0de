// Processes as the agent's own objects: spawn, list_processes, attach, send_stdin,
// close_stdin, signal, resize, and exec calls' commands in the same table, on the real agent.
#include "tests/agent/agent_harness.hpp"

using namespace agentvm;
using namespace agentvm::agent_test;

namespace {

// The agent's resident memory, from /proc.
long resident_kib(pid_t pid)
{
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(status, line);)
        if (line.starts_with("VmRSS:"))
            return std::atol(line.c_str() + 6);
    return -1;
}

// An attach call's whole run: its events' bytes per stream, and its final response.
struct Attached {
    std::map<std::string, std::string> output;
    uint64_t lost = 0;
    bool saw_attached = false;
    Json end;
};

Attached attach(Client& client, const Json& request)
{
    Attached attached;
    std::vector<Json> events;
    attached.end = client.call(request, &events);
    for (const Json& event : events) {
        const std::string kind = event["event"];
        if (kind == "attached")
            attached.saw_attached = true;
        else if (kind == "lost")
            attached.lost += event["bytes"].get<uint64_t>();
        else
            attached.output[kind] += bytes_of(event, "data");
    }
    return attached;
}

Json entry_of(Client& client, int id, int pid)
{
    const Json list = client.call({{"id", id}, {"op", "list_processes"}});
    REQUIRE(list["ok"] == true);
    for (const Json& entry : list["processes"])
        if (entry["pid"] == pid)
            return entry;
    FAIL("process " << pid << " not listed in " << list.dump());
    return {};
}

} // namespace

TEST_CASE("a spawned server outlives its connection: listed, attached to from another, told to stop with SIGTERM")
{
    Agent agent;
    int pid = 0;
    {
        Client starter(agent);
        const Json started = starter.call(
            {{"id", 1}, {"op", "spawn"}, {"tag", "server"}, {"cwd", agent.dir()}, {"env", {{"GREETING", "hello"}}},
             {"argv", {"sh", "-c", "trap 'echo got TERM; exit 0' TERM; echo $GREETING; echo oops >&2; "
                                   "while :; do sleep 0.05; done"}}});
        REQUIRE(started["ok"] == true);
        pid = started["pid"];
        CHECK(pid > 0);
    }  // the connection that started it is gone; the process is not

    Client other(agent);
    const Json entry = entry_of(other, 1, pid);
    CHECK(entry["tag"] == "server");
    CHECK(entry["kind"] == "spawn");
    CHECK(entry["running"] == true);
    CHECK(entry["argv"][0] == "sh");
    CHECK(entry["env"]["GREETING"] == "hello");
    CHECK(entry["cwd"] == agent.dir());
    CHECK(entry["started_at"].get<double>() > 1.7e9);
    CHECK_FALSE(entry.contains("end"));

    // Attached by tag from the second connection, with what it wrote before; SIGTERM is
    // sent from a third, and the trap's answer and the exit reach the attachment.
    other.send({{"id", 2}, {"op", "attach"}, {"tag", "server"}});
    Json first = other.next_line();
    CHECK(first["event"] == "attached");
    CHECK(first["pid"] == pid);
    Client third(agent);
    CHECK(third.call({{"id", 1}, {"op", "signal"}, {"pid", pid}, {"signal", "TERM"}})["ok"] == true);
    std::map<std::string, std::string> output;
    Json end;
    for (;;) {
        Json line = other.next_line();
        REQUIRE(line["id"] == 2);
        if (!line.contains("event")) {
            end = line;
            break;
        }
        output[line["event"]] += bytes_of(line, "data");
    }
    CHECK(output["stdout"] == "hello\ngot TERM\n");
    CHECK(output["stderr"] == "oops\n");
    CHECK(end["pid"] == pid);
    CHECK(end["exit_code"] == 0);
    CHECK(end["signal"].is_null());
    CHECK(end["timed_out"] == false);

    // Its end is kept: a late attach replays the output and learns how it ended.
    const Attached late = attach(third, {{"id", 2}, {"op", "attach"}, {"pid", pid}});
    CHECK(late.saw_attached);
    CHECK(late.output.at("stdout") == "hello\ngot TERM\n");
    CHECK(late.end["exit_code"] == 0);
    const Json ended = entry_of(third, 3, pid);
    CHECK(ended["running"] == false);
    CHECK(ended["end"]["exit_code"] == 0);
    // A process that has ended takes no signal.
    CHECK(third.call({{"id", 4}, {"op", "signal"}, {"pid", pid}, {"signal", "KILL"}})["error"]["code"] == "not_found");
}

TEST_CASE("stdin streamed in 1,000 pieces, then closed, reaches the process whole and in order")
{
    Agent agent;
    Client client(agent);
    const Json started = client.call({{"id", 1}, {"op", "spawn"}, {"stdin", true}, {"argv", {"sha256sum"}}});
    REQUIRE(started["ok"] == true);
    const int pid = started["pid"];
    std::string all;
    for (int i = 0; i < 1000; ++i) {
        const std::string piece = "piece " + std::to_string(i) + " " + std::string(static_cast<size_t>(i % 97), 'x') + "\n";
        all += piece;
        client.send({{"id", 100 + i}, {"op", "send_stdin"}, {"pid", pid}, {"data", piece}});
    }
    for (int i = 0; i < 1000; ++i) {
        const Json answer = client.next_line();
        REQUIRE(answer["ok"] == true);
        CHECK(answer["id"] == 100 + i);
    }
    CHECK(client.call({{"id", 2}, {"op", "close_stdin"}, {"pid", pid}})["ok"] == true);
    const Attached attached = attach(client, {{"id", 3}, {"op", "attach"}, {"pid", pid}});
    CHECK(attached.end["exit_code"] == 0);
    // The same digest as the bytes computed here, by the same tool.
    const std::string path = agent.dir() + "/all";
    std::ofstream(path, std::ios::binary) << all;
    Client check(agent);
    const Json expected = check.exec({{"argv", {"sha256sum", path}}});
    CHECK(attached.output.at("stdout").substr(0, 64) == bytes_of(expected, "stdout").substr(0, 64));
    // Closed: no more input.
    CHECK(client.call({{"id", 4}, {"op", "send_stdin"}, {"pid", pid}, {"data", "late"}})["error"]["code"]
          == "not_found");
}

TEST_CASE("stdin errors: a process spawned without stdin, one whose stdin is closed, and a full queue")
{
    Agent agent;
    Client client(agent);
    const Json plain = client.call({{"id", 1}, {"op", "spawn"}, {"argv", {"sleep", "30"}}});
    REQUIRE(plain["ok"] == true);
    const Json refused = client.call({{"id", 2}, {"op", "send_stdin"}, {"pid", plain["pid"]}, {"data", "x"}});
    CHECK(refused["error"]["code"] == "stdin_closed");

    // A process that never reads: the queue takes 8 MiB, then refuses, and nothing blocks.
    const Json idle = client.call({{"id", 3}, {"op", "spawn"}, {"stdin", true}, {"argv", {"sleep", "30"}}});
    REQUIRE(idle["ok"] == true);
    const std::string mib(1 << 20, 'm');
    std::string code;
    for (int i = 0; i < 20 && code.empty(); ++i) {
        const Json answer = client.call({{"id", 10 + i}, {"op", "send_stdin"}, {"pid", idle["pid"]}, {"data", mib}});
        if (answer.contains("error"))
            code = answer["error"]["code"];
    }
    CHECK(code == "limit");
    CHECK(client.call({{"id", 4}, {"op", "close_stdin"}, {"pid", idle["pid"]}})["ok"] == true);
    CHECK(client.call({{"id", 5}, {"op", "send_stdin"}, {"pid", idle["pid"]}, {"data", "x"}})["error"]["code"]
          == "stdin_closed");
    for (const Json& started : {plain, idle})
        CHECK(client.call({{"id", 6}, {"op", "signal"}, {"pid", started["pid"]}, {"signal", 9}})["ok"] == true);
}

TEST_CASE("a pty: the process has a terminal of the size asked, takes input, and is resized")
{
    Agent agent;
    Client client(agent);
    const Json started = client.call({{"id", 1},
                                      {"op", "spawn"},
                                      {"tag", "term"},
                                      {"pty", {{"rows", 30}, {"cols", 100}}},
                                      {"argv", {"sh", "-c", "stty size; read line; echo got:$line; "
                                                            "read again; stty size"}}});
    REQUIRE(started["ok"] == true);
    CHECK(entry_of(client, 2, started["pid"])["pty"] == true);
    client.send({{"id", 3}, {"op", "attach"}, {"tag", "term"}});
    std::string seen;
    const auto wait_for = [&](const std::string& text) {
        while (seen.find(text) == std::string::npos) {
            const Json line = client.next_line();
            REQUIRE(line.contains("event"));
            if (line["event"] == "pty")
                seen += bytes_of(line, "data");
        }
    };
    wait_for("30 100");
    CHECK(client.call({{"id", 4}, {"op", "send_stdin"}, {"tag", "term"}, {"data", "typed\n"}})["ok"] == true);
    wait_for("got:typed");
    CHECK(client.call({{"id", 5}, {"op", "resize"}, {"tag", "term"}, {"rows", 40}, {"cols", 120}})["ok"] == true);
    CHECK(client.call({{"id", 6}, {"op", "send_stdin"}, {"tag", "term"}, {"data", "\n"}})["ok"] == true);
    wait_for("40 120");
    for (;;) {
        const Json line = client.next_line();
        if (!line.contains("event")) {
            CHECK(line["id"] == 3);
            CHECK(line["exit_code"] == 0);
            break;
        }
    }
    // A pty's input is ended by ^D, not closed; a process without one has no size.
    const Json plain = client.call({{"id", 7}, {"op", "spawn"}, {"argv", {"sleep", "30"}}});
    CHECK(client.call({{"id", 8}, {"op", "resize"}, {"pid", plain["pid"]}, {"rows", 1}, {"cols", 1}})["error"]["code"]
          == "bad_field");
    CHECK(client.call({{"id", 9}, {"op", "signal"}, {"pid", plain["pid"]}, {"signal", "SIGKILL"}})["ok"] == true);
}

TEST_CASE("an exec call's command is listed while it runs, reachable by tag, and a signal ends the call")
{
    Agent agent;
    Client caller(agent);
    caller.send({{"id", 1}, {"op", "exec"}, {"tag", "job"}, {"argv", {"sh", "-c", "echo started; exec sleep 30"}}});
    Client other(agent);
    // Attached from elsewhere once it runs: its output also reaches the attachment.
    Json attached_started;
    for (int i = 0; i < 500; ++i) {
        attached_started = other.call({{"id", 1}, {"op", "list_processes"}});
        if (!attached_started["processes"].empty())
            break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    REQUIRE(attached_started["processes"].size() == 1);
    CHECK(attached_started["processes"][0]["kind"] == "exec");
    CHECK(attached_started["processes"][0]["tag"] == "job");
    // A second process may not take a running one's tag.
    CHECK(other.call({{"id", 2}, {"op", "spawn"}, {"tag", "job"}, {"argv", {"true"}}})["error"]["code"] == "exists");
    other.send({{"id", 3}, {"op", "attach"}, {"tag", "job"}});
    CHECK(other.next_line()["event"] == "attached");
    std::string seen;
    while (seen.find("started") == std::string::npos) {
        const Json line = other.next_line();
        REQUIRE(line.contains("event"));
        seen += bytes_of(line, "data");
    }
    CHECK(other.call({{"id", 4}, {"op", "signal"}, {"tag", "job"}, {"signal", "INT"}, {"group", true}})["ok"] == true);
    const Json answer = caller.next_line();
    CHECK(answer["id"] == 1);
    CHECK(answer["signal"] == SIGINT);
    CHECK(bytes_of(answer, "stdout") == "started\n");
    const Json end = other.next_line();
    CHECK(end["id"] == 3);
    CHECK(end["signal"] == SIGINT);
}

TEST_CASE("attach: cancelling detaches and the process runs on; replay:false starts from now; a timeout kills")
{
    Agent agent;
    Client client(agent);
    const Json started = client.call({{"id", 1}, {"op", "spawn"}, {"timeout", 1.5},
                                      {"argv", {"sh", "-c", "echo early; sleep 0.3; echo later; sleep 30"}}});
    REQUIRE(started["ok"] == true);
    const int pid = started["pid"];
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    client.send({{"id", 2}, {"op", "attach"}, {"pid", pid}, {"replay", false}});
    CHECK(client.next_line()["event"] == "attached");
    const Json later = client.next_line();
    CHECK(later["event"] == "stdout");
    CHECK(bytes_of(later, "data") == "later\n");
    CHECK(client.call({{"id", 3}, {"op", "cancel"}, {"call", 2}})["running"] == true);
    const Json detached = client.next_line();
    CHECK(detached["id"] == 2);
    CHECK(detached["detached"] == true);
    CHECK(entry_of(client, 4, pid)["running"] == true);
    // Its own timeout ends it: killed with its group, and the end says so.
    const Attached rest = attach(client, {{"id", 5}, {"op", "attach"}, {"pid", pid}});
    CHECK(rest.output.at("stdout") == "early\nlater\n");
    CHECK(rest.end["timed_out"] == true);
    CHECK(rest.end["signal"] == SIGKILL);
}

TEST_CASE("bounds: a flood with no reader costs bounded memory and reports what a slow attachment lost")
{
    Agent agent;
    Client client(agent);
    const long before = resident_kib(agent.pid());
    const Json started = client.call({{"id", 1}, {"op", "spawn"}, {"argv", {"sh", "-c", "exec yes flood"}}});
    REQUIRE(started["ok"] == true);
    std::this_thread::sleep_for(std::chrono::seconds(2));
    // yes writes hundreds of MiB a second; the agent keeps the last MiB.
    const long after = resident_kib(agent.pid());
    CHECK(after - before < 32 * 1024);
    // An attachment that replays starts at what is kept, not at byte 0: it missed the rest.
    client.send({{"id", 2}, {"op", "attach"}, {"pid", started["pid"]}});
    CHECK(client.next_line()["event"] == "attached");
    uint64_t received = 0;
    while (received < (4u << 20)) {
        const Json line = client.next_line();
        REQUIRE(line.contains("event"));
        if (line["event"] == "stdout")
            received += bytes_of(line, "data").size();
    }
    // The signal's answer comes amid the attachment's events, the attachment's end after them.
    client.send({{"id", 3}, {"op", "signal"}, {"pid", started["pid"]}, {"signal", "KILL"}});
    bool signalled = false;
    for (;;) {
        const Json line = client.next_line();
        if (line["id"] == 3) {
            CHECK(line["ok"] == true);
            signalled = true;
        } else if (!line.contains("event")) {
            CHECK(line["id"] == 2);
            CHECK(line["signal"] == SIGKILL);
            break;
        }
    }
    CHECK(signalled);
    CHECK(resident_kib(agent.pid()) - before < 32 * 1024);
}

TEST_CASE("bounds: of 10,000 spawns, as many run as --max-processes allows; attachments are bounded too")
{
    // The bound the agent runs with (1024 by default; a lower one here, for 1024 forks from a
    // loaded host take minutes). The guest's pids.max bounds what the processes themselves start.
    constexpr int max_processes = 64;
    Agent agent(0, "", max_processes);
    Client client(agent);
    for (int i = 0; i < 10000; ++i)
        client.send({{"id", i}, {"op", "spawn"}, {"argv", {"sleep", "60"}}});
    int started = 0;
    int limited = 0;
    int first_pid = 0;
    for (int i = 0; i < 10000; ++i) {
        const Json answer = client.next_line();
        if (answer.value("ok", false)) {
            ++started;
            if (!first_pid)
                first_pid = answer["pid"];
        } else if (answer["error"]["code"] == "limit") {
            ++limited;
        }
    }
    CHECK(started == max_processes);
    CHECK(limited == 10000 - max_processes);
    CHECK(client.call({{"id", "list"}, {"op", "list_processes"}})["processes"].size() == max_processes);

    for (int i = 0; i < 16; ++i)
        client.send({{"id", "a" + std::to_string(i)}, {"op", "attach"}, {"pid", first_pid}});
    for (int i = 0; i < 16; ++i)
        CHECK(client.next_line()["event"] == "attached");
    CHECK(client.call({{"id", "17th"}, {"op", "attach"}, {"pid", first_pid}})["error"]["code"] == "limit");
    // Unknown processes and bad requests.
    CHECK(client.call({{"id", "u"}, {"op", "attach"}, {"pid", 1 << 30}})["error"]["code"] == "not_found");
    CHECK(client.call({{"id", "t"}, {"op", "signal"}, {"tag", "nobody"}, {"signal", "TERM"}})["error"]["code"]
          == "not_found");
    CHECK(client.call({{"id", "s"}, {"op", "signal"}, {"pid", first_pid}, {"signal", "SEGV"}})["error"]["code"]
          == "bad_field");
}

TEST_CASE("the persistent shell and the interpreter contexts are listed while they run, and take signals")
{
    Agent agent;
    Client client(agent);
    CHECK(client.call({{"id", 1}, {"op", "shell"}, {"cmd", "X=kept; echo $$"}})["exit_code"] == 0);
    const Json cell = client.call({{"id", 2}, {"op", "run_code"}, {"code", "import os\nos.getpid()"}});
    const int python_pid = std::stoi(cell["result"].get<std::string>());
    const Json shell_echo = client.call({{"id", 3}, {"op", "shell"}, {"cmd", "echo $$"}});
    const int bash_pid = std::stoi(bytes_of(shell_echo, "stdout"));
    const Json list = client.call({{"id", 4}, {"op", "list_processes"}});
    std::map<std::string, Json> by_kind;
    for (const Json& entry : list["processes"])
        by_kind[entry["kind"]] = entry;
    REQUIRE(by_kind.contains("shell"));
    REQUIRE(by_kind.contains("context"));
    CHECK(by_kind["shell"]["pid"] == bash_pid);
    CHECK(by_kind["context"]["pid"] == python_pid);
    CHECK(by_kind["context"]["context"] == "default");
    CHECK(by_kind["context"]["language"] == "python");
    // SIGKILL to the bash ends the session: the next shell call starts a fresh one.
    CHECK(client.call({{"id", 5}, {"op", "signal"}, {"pid", bash_pid}, {"signal", "KILL"}})["ok"] == true);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the kill lands
    const Json fresh = client.call({{"id", 6}, {"op", "shell"}, {"cmd", "echo \"[$X]\""}});
    CHECK(bytes_of(fresh, "stdout") == "[]\n");
    // SIGINT to the interpreter interrupts its running cell, which answers KeyboardInterrupt.
    client.send({{"id", 7}, {"op", "run_code"}, {"code", "import time\ntime.sleep(30)"}});
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    CHECK(client.call({{"id", 8}, {"op", "signal"}, {"pid", python_pid}, {"signal", "INT"}})["ok"] == true);
    const Json interrupted = client.next_line();
    CHECK(interrupted["id"] == 7);
    CHECK(interrupted["exception"]["type"] == "KeyboardInterrupt");
}
