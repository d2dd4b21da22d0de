// Drives the real agentvm-agent binary on the host over --listen unix:PATH, as the host
// side will over vsock: request lines in, response and event lines out.
#include "tests/agent/agent_harness.hpp"

using namespace agentvm;
using namespace agentvm::agent_test;

TEST_CASE("echo and exit codes")
{
    Agent agent;
    Client client(agent);
    Json ok = client.exec({{"argv", {"echo", "hello", "world"}}});
    CHECK(bytes_of(ok, "stdout") == "hello world\n");
    CHECK(bytes_of(ok, "stderr") == "");
    CHECK(ok["exit_code"] == 0);
    CHECK(ok["signal"].is_null());
    CHECK(ok["timed_out"] == false);
    CHECK(ok["oom_killed"] == false);
    CHECK(ok["stdout_truncated"] == false);
    CHECK(ok["stderr_truncated"] == false);
    CHECK(ok["duration_ms"].is_number_unsigned());
    CHECK(client.exec({{"argv", {"sh", "-c", "exit 7"}}})["exit_code"] == 7);
    CHECK(client.exec({{"argv", {"false"}}})["exit_code"] == 1);

    Json missing = client.exec({{"argv", {"no-such-command-xyz"}}});
    CHECK(missing["error"]["code"] == "not_found");
    Json not_exec = client.exec({{"argv", {"/etc/hostname"}}});
    CHECK(not_exec["error"]["code"] == "spawn_failed");
}

TEST_CASE("commands do not inherit the agent's oom_score_adj (its protection from the OOM killer)")
{
    Agent agent(500);
    Client client(agent);
    Json r = client.exec({{"argv", {"sh", "-c", "cat /proc/$PPID/oom_score_adj /proc/self/oom_score_adj"}}});
    // The sh is the call's own process; its parent is the agent.
    CHECK(bytes_of(r, "stdout") == "500\n0\n");
    r = client.call({{"id", "s"}, {"op", "shell"}, {"cmd", "cat /proc/self/oom_score_adj"}});
    CHECK(bytes_of(r, "stdout") == "0\n");

    // An unprotected agent leaves its commands as they are.
    Agent plain;
    Client other(plain);
    r = other.exec({{"argv", {"cat", "/proc/self/oom_score_adj"}}});
    CHECK(bytes_of(r, "stdout") == "0\n");
}

TEST_CASE("stderr apart from stdout, binary output as base64")
{
    Agent agent;
    Client client(agent);
    Json r = client.exec({{"argv", {"sh", "-c", "echo out; echo err >&2; printf '\\377\\000' >&2"}}});
    CHECK(bytes_of(r, "stdout") == "out\n");
    CHECK(r.contains("stderr_b64"));
    CHECK(bytes_of(r, "stderr") == std::string("err\n\xff\x00", 6));
}

TEST_CASE("stdin is delivered, as text and as bytes, and large stdin does not deadlock")
{
    Agent agent;
    Client client(agent);
    CHECK(bytes_of(client.exec({{"argv", {"cat"}}, {"stdin", "line one\nline two"}}), "stdout")
        == "line one\nline two");
    const std::string binary("\x00\x01\xfe\xff", 4);
    CHECK(bytes_of(client.exec({{"argv", {"cat"}}, {"stdin_b64", base64_encode(binary)}}), "stdout") == binary);
    // More than a pipe holds, both ways at once.
    const std::string big(4 << 20, 'a');
    Json r = client.exec({{"argv", {"cat"}}, {"stdin", big}});
    CHECK(bytes_of(r, "stdout").size() == big.size());
    // Without stdin the command reads /dev/null rather than hanging.
    CHECK(bytes_of(client.exec({{"argv", {"cat"}}}), "stdout") == "");
    // A command that never reads its stdin still finishes.
    CHECK(client.exec({{"argv", {"true"}}, {"stdin", big}})["exit_code"] == 0);
}

TEST_CASE("env is added to the agent's environment and cwd is honoured")
{
    Agent agent;
    Client client(agent);
    Json r = client.exec({{"argv", {"sh", "-c", "echo \"$GREETING|$PATH\"; pwd"}},
        {"env", {{"GREETING", "hi there"}}}, {"cwd", agent.dir()}});
    const std::string out = bytes_of(r, "stdout");
    CHECK(out.starts_with("hi there|"));
    CHECK(out.find("|\n") == std::string::npos); // PATH inherited from the agent
    CHECK(out.ends_with(agent.dir() + "\n"));
    CHECK(client.exec({{"argv", {"true"}}, {"cwd", agent.dir() + "/missing"}})["error"]["code"] == "not_found");
}

TEST_CASE("exit by signal")
{
    Agent agent;
    Client client(agent);
    Json r = client.exec({{"argv", {"sh", "-c", "kill -TERM $$"}}});
    CHECK(r["exit_code"].is_null());
    CHECK(r["signal"] == SIGTERM);
    CHECK(r["timed_out"] == false);
    // A command that kills its whole process group leaves the agent and connection fine.
    Json group = client.exec({{"argv", {"sh", "-c", "kill -KILL 0"}}});
    CHECK(group["signal"] == SIGKILL);
    CHECK(group["oom_killed"] == false);
    CHECK(client.exec({{"argv", {"true"}}})["exit_code"] == 0);
    CHECK(agent.alive());
}

TEST_CASE("timeout kills the whole process group")
{
    Agent agent;
    Client client(agent);
    // The odd sleep length marks both sleeps (and only them) in /proc/*/cmdline.
    const std::string marker = "1000." + std::to_string(::getpid()) + "1";
    const auto start = Clock::now();
    Json r = client.exec({{"argv", {"sh", "-c", "sleep " + marker + " & sleep " + marker}}, {"timeout", 0.5}});
    const auto took = Clock::now() - start;
    CHECK(r["timed_out"] == true);
    CHECK(r["signal"] == SIGKILL);
    CHECK(r["exit_code"].is_null());
    CHECK(r["oom_killed"] == false);
    // Not early (a lower bound holds on any machine); not late is the runner's timeout's job,
    // since without the kill the call would last 1000 s.
    CHECK(took >= std::chrono::milliseconds(450));
    CHECK(gone(marker));
}

TEST_CASE("100 MiB of output with max_output 1 MiB is truncated, and the command runs to its end")
{
    Agent agent;
    Client client(agent);
    Json r = client.exec({{"argv", {"sh", "-c", "yes | head -c 104857600; echo done >&2"}}, {"max_output", 1 << 20}});
    CHECK(r["exit_code"] == 0);
    CHECK(bytes_of(r, "stdout") == [] {
        std::string expected;
        while (expected.size() < (1 << 20))
            expected += "y\n";
        return expected;
    }());
    CHECK(r["stdout_truncated"] == true);
    CHECK(bytes_of(r, "stderr") == "done\n");
    CHECK(r["stderr_truncated"] == false);
}

TEST_CASE("streamed output arrives as events before the response, and matches it")
{
    Agent agent;
    Client client(agent);
    std::vector<Json> events;
    Json r = client.call({{"id", "s"}, {"op", "exec"}, {"argv", {"sh", "-c", "echo a; sleep 0.1; echo b >&2; echo c"}},
                             {"stream", true}},
        &events);
    std::string out, err;
    for (const Json& e : events) {
        if (e["event"] == "stdout")
            out += bytes_of(e, "data");
        else if (e["event"] == "stderr")
            err += bytes_of(e, "data");
        else
            FAIL("unexpected event " << e.dump());
    }
    CHECK(out == "a\nc\n");
    CHECK(err == "b\n");
    CHECK(bytes_of(r, "stdout") == out);
    CHECK(bytes_of(r, "stderr") == err);
}

TEST_CASE("stream \"only\": output arrives as events of at most 64 KiB and stays out of the response")
{
    Agent agent;
    Client client(agent);
    for (const char* op : {"exec", "shell"}) {
        INFO(op);
        // 300 KiB in one write on stdout, a line on stderr, from exec and from the shell.
        const std::string script = "head -c 307200 /dev/zero | tr '\\0' x; echo e >&2";
        Json request{{"id", op}, {"op", op}, {"stream", "only"}};
        if (std::string(op) == "exec")
            request["argv"] = {"sh", "-c", script};
        else
            request["cmd"] = script;
        std::vector<Json> events;
        Json r = client.call(request, &events);
        std::string out, err;
        for (const Json& e : events) {
            const std::string data = bytes_of(e, "data");
            CHECK(data.size() <= 65536);
            (e["event"] == "stdout" ? out : err) += data;
        }
        CHECK(out == std::string(307200, 'x'));
        CHECK(err == "e\n");
        CHECK(r["exit_code"] == 0);
        for (const char* field : {"stdout", "stdout_b64", "stderr", "stderr_b64"})
            CHECK_FALSE(r.contains(field));
        CHECK(r["stdout_truncated"] == false);
        CHECK(r["stderr_truncated"] == false);
    }
    // max_output still applies to what is streamed.
    std::vector<Json> events;
    Json r = client.call({{"id", "cut"}, {"op", "exec"}, {"argv", {"sh", "-c", "echo 123456"}}, {"stream", "only"},
                          {"max_output", 3}},
                         &events);
    std::string out;
    for (const Json& e : events)
        out += bytes_of(e, "data");
    CHECK(out == "123");
    CHECK(r["stdout_truncated"] == true);
    CHECK_FALSE(r.contains("stdout"));
}

TEST_CASE("16 pipelined calls run at once")
{
    Agent agent;
    Client client(agent);
    // Each call waits until all 16 have started, which calls run one after the other never
    // would: they would end by their timeout instead (timed_out, a failure here).
    const std::string barrier = make_temp_dir();
    const std::string script = "touch " + barrier + "/$N; while [ $(ls " + barrier
        + " | wc -l) -lt 16 ]; do sleep 0.02; done; echo $N";
    for (int i = 0; i < 16; ++i)
        client.send({{"id", i}, {"op", "exec"}, {"argv", {"sh", "-c", script}},
                     {"env", {{"N", std::to_string(i)}}}, {"timeout", 60}});
    std::set<int> answered;
    for (int i = 0; i < 16; ++i) {
        Json r = client.next_line();
        const int id = r["id"].get<int>();
        CHECK(r["timed_out"] == false);
        CHECK(bytes_of(r, "stdout") == std::to_string(id) + "\n");
        answered.insert(id);
    }
    CHECK(answered.size() == 16);
    std::filesystem::remove_all(barrier);
}

TEST_CASE("200 sequential calls on one connection")
{
    Agent agent;
    Client client(agent);
    for (int i = 0; i < 200; ++i) {
        Json r = client.exec({{"argv", {"echo", std::to_string(i)}}});
        REQUIRE(bytes_of(r, "stdout") == std::to_string(i) + "\n");
    }
}

TEST_CASE("write_file and read_file carry binary data intact")
{
    Agent agent;
    Client client(agent);
    const std::string path = agent.dir() + "/small.bin";
    const std::string small = std::string("\x00\xff\x80 text\n", 8);
    Json w = client.call({{"id", 1}, {"op", "write_file"}, {"path", path}, {"data_b64", base64_encode(small)},
        {"mode", "0751"}});
    CHECK(w["ok"] == true);
    CHECK(w["bytes"] == small.size());
    struct stat st;
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == 0751);
    std::vector<Json> events;
    Json r = client.call({{"id", 2}, {"op", "read_file"}, {"path", path}}, &events);
    CHECK(r["ok"] == true);
    CHECK(r["size"] == small.size());
    CHECK(r["mode"] == "0751");
    REQUIRE(events.size() == 1);
    CHECK(events[0]["event"] == "data");
    CHECK(events[0]["offset"] == 0);
    CHECK(bytes_of(events[0], "data") == small);

    // Text through the plain spelling, then appended.
    CHECK(client.call({{"id", 3}, {"op", "write_file"}, {"path", path}, {"data", "abc"}})["bytes"] == 3);
    CHECK(client.call({{"id", 4}, {"op", "write_file"}, {"path", path}, {"data", "def"}, {"append", true}})["ok"] == true);
    events.clear();
    client.call({{"id", 5}, {"op", "read_file"}, {"path", path}}, &events);
    REQUIRE(events.size() == 1);
    CHECK(bytes_of(events[0], "data") == "abcdef");

    // An empty file: no data events, size 0.
    client.call({{"id", 6}, {"op", "write_file"}, {"path", path}, {"data", ""}});
    events.clear();
    CHECK(client.call({{"id", 7}, {"op", "read_file"}, {"path", path}}, &events)["size"] == 0);
    CHECK(events.empty());

    CHECK(client.call({{"id", 8}, {"op", "read_file"}, {"path", agent.dir() + "/nope"}})["error"]["code"] == "not_found");
    CHECK(client.call({{"id", 9}, {"op", "read_file"}, {"path", agent.dir()}})["error"]["code"] == "io");
    CHECK(client.call({{"id", 10}, {"op", "write_file"}, {"path", agent.dir() + "/no/dir"}, {"data", "x"}})["error"]["code"]
        == "not_found");
}

TEST_CASE("a 64 MiB binary file written in appended chunks reads back with the same hash")
{
    Agent agent;
    Client client(agent);
    const std::string path = agent.dir() + "/big.bin";
    constexpr size_t total = size_t{64} << 20;
    constexpr size_t chunk = size_t{4} << 20;
    std::mt19937_64 random(42);
    uint64_t sent_hash = fnv1a("");
    // Pipelined: every chunk is sent before any answer is read, in order.
    for (size_t offset = 0; offset < total; offset += chunk) {
        std::string data(chunk, '\0');
        for (size_t i = 0; i < chunk; i += 8) {
            const uint64_t v = random();
            std::memcpy(data.data() + i, &v, 8);
        }
        sent_hash = fnv1a(data, sent_hash);
        client.send({{"id", offset}, {"op", "write_file"}, {"path", path}, {"data_b64", base64_encode(data)},
            {"append", offset != 0}});
    }
    for (size_t offset = 0; offset < total; offset += chunk) {
        Json w = client.next_line();
        CHECK(w["id"] == offset);
        CHECK(w["bytes"] == chunk);
    }

    std::vector<Json> events;
    Json r = client.call({{"id", "read"}, {"op", "read_file"}, {"path", path}}, &events);
    CHECK(r["size"] == total);
    CHECK(events.size() == total / (1 << 20));
    uint64_t read_hash = fnv1a("");
    uint64_t expected_offset = 0;
    for (const Json& e : events) {
        REQUIRE(e["offset"] == expected_offset);
        const std::string data = bytes_of(e, "data");
        CHECK(data.size() <= (1 << 20));
        read_hash = fnv1a(data, read_hash);
        expected_offset += data.size();
    }
    CHECK(expected_offset == total);
    CHECK(read_hash == sent_hash);
}

TEST_CASE("malformed lines get errors and the connection goes on")
{
    Agent agent;
    Client client(agent);
    client.send_raw("this is not json\n");
    client.send_raw("[1,2,3]\n");
    client.send_raw("\n"); // blank lines are ignored, not answered
    client.send_raw("{\"id\":1}\n");
    client.send_raw("{\"id\":2,\"op\":\"teleport\"}\n");
    client.send_raw("{\"id\":3,\"op\":\"exec\"}\n");
    client.send_raw("{\"id\":4,\"op\":\"exec\",\"argv\":\"ls\"}\n");
    client.send_raw("{\"id\":5,\"op\":\"exec\",\"argv\":[\"x\"],\"stdin_b64\":\"@@\"}\n");
    // Over the 64 MiB cap, sent in pieces: answered without the agent buffering it.
    const std::string piece(1 << 20, 'x');
    client.send_raw("{\"id\":6,\"data\":\"");
    for (int i = 0; i < 65; ++i)
        client.send_raw(piece);
    client.send_raw("\"}\n");
    client.send({{"id", 7}, {"op", "exec"}, {"argv", {"echo", "still here"}}});

    const std::vector<std::pair<Json, std::string>> expected = {
        {nullptr, "bad_json"}, {nullptr, "bad_json"}, {1, "missing_field"}, {2, "unknown_op"},
        {3, "missing_field"}, {4, "bad_field"}, {5, "bad_field"}, {nullptr, "line_too_long"},
    };
    for (const auto& [id, code] : expected) {
        Json e = client.next_line();
        CHECK(e["id"] == id);
        CHECK(e["error"]["code"] == code);
        CHECK(e["error"]["message"].is_string());
    }
    Json good = client.next_line();
    CHECK(good["id"] == 7);
    CHECK(bytes_of(good, "stdout") == "still here\n");
}

TEST_CASE("close answers, then ends the connection after earlier calls finish")
{
    Agent agent;
    Client client(agent);
    client.send({{"id", 1}, {"op", "exec"}, {"argv", {"sh", "-c", "sleep 0.2; echo late"}}});
    client.send({{"id", 2}, {"op", "close"}});
    client.send({{"id", 3}, {"op", "exec"}, {"argv", {"echo", "ignored"}}});
    Json first = client.next_line();
    CHECK(first["id"] == 1);
    CHECK(bytes_of(first, "stdout") == "late\n");
    Json closed = client.next_line();
    CHECK(closed["id"] == 2);
    CHECK(closed["ok"] == true);
    CHECK_FALSE(client.next());
}

TEST_CASE("a client that only shuts down its sending side still gets its answers")
{
    Agent agent;
    Client client(agent);
    client.send({{"id", 1}, {"op", "exec"}, {"argv", {"sh", "-c", "sleep 0.3; echo done"}}});
    client.shutdown_sending();
    Json r = client.next_line();
    CHECK(bytes_of(r, "stdout") == "done\n");
    CHECK_FALSE(client.next()); // then the agent closes
}

TEST_CASE("a client that hangs up cancels its calls; the agent keeps serving")
{
    Agent agent;
    const std::string marker = "1000." + std::to_string(::getpid()) + "2";
    {
        Client client(agent);
        client.send({{"id", 1}, {"op", "exec"}, {"argv", {"sleep", marker}}});
        REQUIRE(appears(marker));
    }
    CHECK(gone(marker));
    Client again(agent);
    CHECK(bytes_of(again.exec({{"argv", {"echo", "ok"}}}), "stdout") == "ok\n");
    CHECK(agent.alive());
}

TEST_CASE("shell: cd, exports and functions persist between calls; errors do not wedge it")
{
    Agent agent;
    Client client(agent);
    int id = 0;
    auto shell = [&](const std::string& cmd, Json extra = Json::object()) {
        extra["id"] = ++id;
        extra["op"] = "shell";
        extra["cmd"] = cmd;
        return client.call(extra);
    };
    Json first = shell("cd '" + agent.dir() + "' && export GREETING=hi && f() { echo \"f:$1\"; }");
    CHECK(first["exit_code"] == 0);
    Json second = shell("pwd; echo $GREETING; f x; echo err >&2");
    CHECK(bytes_of(second, "stdout") == agent.dir() + "\nhi\nf:x\n");
    CHECK(bytes_of(second, "stderr") == "err\n");
    CHECK(second["stdout_truncated"] == false);
    CHECK(shell("false")["exit_code"] == 1);
    CHECK(shell("sh -c 'kill -TERM $$'")["exit_code"] == 128 + SIGTERM);
    // A syntax error is the command's failure, not the shell's.
    Json syntax = shell("if then fi '");
    CHECK(syntax["exit_code"] == 2);
    CHECK(bytes_of(shell("echo $GREETING"), "stdout") == "hi\n");
    // Multi-line commands and quotes pass through intact.
    CHECK(bytes_of(shell("for i in 1 2; do\n  echo \"it's $i\"\ndone"), "stdout") == "it's 1\nit's 2\n");
    CHECK(bytes_of(shell("yes | head -c 100000", {{"max_output", 10}}), "stdout") == "y\ny\ny\ny\ny\n");
}

TEST_CASE("shell: background jobs survive the call; timeout and exit restart the shell")
{
    Agent agent;
    const std::string marker = "1000." + std::to_string(::getpid()) + "3";
    {
        Client client(agent);
        int id = 0;
        auto shell = [&](const std::string& cmd, Json extra = Json::object()) {
            extra["id"] = ++id;
            extra["op"] = "shell";
            extra["cmd"] = cmd;
            return client.call(extra);
        };
        // The call answers while its job still runs (the sleep lasts 1000 s).
        Json background = shell("sleep " + marker + " & echo started");
        CHECK(bytes_of(background, "stdout") == "started\n");
        CHECK(appears(marker));
        CHECK(bytes_of(shell("jobs | wc -l"), "stdout") == "1\n");

        shell("cd /");
        Json timed = shell("sleep 30", {{"timeout", 0.3}});
        CHECK(timed["timed_out"] == true);
        CHECK(timed["signal"] == SIGKILL);
        CHECK(gone(marker)); // the timeout took the whole shell, jobs included
        CHECK(bytes_of(shell("pwd"), "stdout") != "/\n"); // a fresh shell

        Json exited = shell("exit 4");
        CHECK(exited["exit_code"] == 4);
        CHECK(exited["signal"].is_null());
        CHECK(bytes_of(shell("echo back"), "stdout") == "back\n");

        // The shell killed between calls, by a job of its own: the next call starts anew.
        CHECK(shell("(sleep 0.1; kill -KILL $$) >/dev/null 2>&1 &")["exit_code"] == 0);
        std::this_thread::sleep_for(std::chrono::milliseconds(400));
        CHECK(bytes_of(shell("echo again"), "stdout") == "again\n");

        // Calls pipelined on the shell run in order.
        for (int i = 0; i < 5; ++i)
            client.send({{"id", 100 + i}, {"op", "shell"}, {"cmd", "echo " + std::to_string(i) + " >> order.txt; cat order.txt | wc -l"}});
        std::map<int, std::string> outputs;
        for (int i = 0; i < 5; ++i) {
            Json r = client.next_line();
            outputs[r["id"].get<int>() - 100] = bytes_of(r, "stdout");
        }
        for (int i = 0; i < 5; ++i)
            CHECK(outputs[i] == std::to_string(i + 1) + "\n");
        shell("rm -f order.txt; cd /tmp && export KEPT=across; sleep " + marker + " &");
        CHECK(appears(marker));
    }
    // The shell is the agent's, not the connection's: closing the connection leaves it and its
    // jobs running, and the next connection finds its cwd and variables (as the host's does
    // after a restore resets the vsock transport).
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK_FALSE(gone(marker));
    {
        Client client(agent);
        Json back = client.call({{"id", 1}, {"op", "shell"}, {"cmd", "pwd; echo $KEPT; jobs | wc -l; kill %1"}});
        CHECK(bytes_of(back, "stdout") == "/tmp\nacross\n1\n");
        CHECK(gone(marker));
    }
    CHECK(agent.alive());
}
