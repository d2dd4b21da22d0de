// The run_code call on the real agent: one persistent python3 per connection (needs python3
// on the host running the tests, as the guest rootfs has it).
#include "tests/agent/agent_harness.hpp"

using namespace agentvm;
using namespace agentvm::agent_test;

namespace {

struct Cells {
    Client& client;
    int id = 0;

    Json run(const std::string& code, Json extra = Json::object(), std::vector<Json>* events = nullptr)
    {
        extra["id"] = ++id;
        extra["op"] = "run_code";
        extra["code"] = code;
        return client.call(extra, events);
    }
};

} // namespace

TEST_CASE("run_code: variables, imports and functions persist; the last expression is the result")
{
    Agent agent;
    Client client(agent);
    Cells cells{client};

    Json first = cells.run("import math\nx = math.factorial(5)\nprint('x is', x)\nx * 2");
    CHECK(first["result"] == "240");
    CHECK(first["result_truncated"] == false);
    CHECK(first["exception"].is_null());
    CHECK(first["timed_out"] == false);
    CHECK(first["state_lost"] == false);
    CHECK(bytes_of(first, "stdout") == "x is 120\n");
    CHECK(bytes_of(first, "stderr") == "");
    CHECK(first["duration_ms"].is_number_unsigned());

    CHECK(cells.run("def twice(v):\n    return 2 * v")["result"].is_null());
    CHECK(cells.run("twice(x) + math.floor(0.5)")["result"] == "240");
    // A value of None and a last statement that is not an expression show nothing.
    CHECK(cells.run("None")["result"].is_null());
    CHECK(cells.run("y = [1, 'a']")["result"].is_null());
    CHECK(cells.run("y")["result"] == "[1, 'a']");
    CHECK(cells.run("__name__")["result"] == "'__main__'");

    // Everything written to descriptors 1 and 2 is the cell's, also by processes it starts.
    Json output = cells.run("import os, sys\nsys.stderr.write('to stderr\\n')\nos.system('echo from a child')\n"
                            "os.write(1, b'raw\\n')\n0");
    CHECK(bytes_of(output, "stdout") == "from a child\nraw\n");
    CHECK(bytes_of(output, "stderr") == "to stderr\n");
    CHECK(output["result"] == "0");
    // Output between cells goes nowhere: the next cell starts clean.
    CHECK(bytes_of(cells.run("1"), "stdout") == "");
    // Reading stdin gets end of file, not the agent's commands.
    CHECK(cells.run("import sys\nsys.stdin.read()")["result"] == "''");
    // Classes defined in a cell belong to __main__ and pickle.
    CHECK(cells.run("class Point:\n    pass\nimport pickle\ntype(pickle.loads(pickle.dumps(Point()))).__name__")["result"]
          == "'Point'");
}

TEST_CASE("run_code: exceptions are data with the cell's own traceback; the interpreter goes on")
{
    Agent agent;
    Client client(agent);
    Cells cells{client};
    cells.run("kept = 1");

    Json zero = cells.run("def f():\n    return 1 / 0\nf()");
    REQUIRE(zero["exception"].is_object());
    CHECK(zero["exception"]["type"] == "ZeroDivisionError");
    CHECK(zero["exception"]["message"] == "division by zero");
    const std::string traceback = zero["exception"]["traceback"];
    CHECK(traceback.find("File \"<cell 2>\", line 3, in <module>") != std::string::npos);
    CHECK(traceback.find("return 1 / 0") != std::string::npos);  // the cell's source is shown
    CHECK(traceback.find("<string>") == std::string::npos);      // the driver's frames are not
    CHECK(zero["result"].is_null());
    CHECK(zero["state_lost"] == false);

    Json syntax = cells.run("def broken(:");
    CHECK(syntax["exception"]["type"] == "SyntaxError");
    CHECK(syntax["exception"]["traceback"].get<std::string>().find("<cell 3>") != std::string::npos);
    CHECK(syntax["exception"]["traceback"].get<std::string>().find("ast.py") == std::string::npos);

    CHECK(cells.run("import json\njson.loads('x')")["exception"]["type"] == "json.decoder.JSONDecodeError");
    // SystemExit is the cell's too: the interpreter and its state stay.
    Json exiting = cells.run("import sys\nsys.exit(3)");
    CHECK(exiting["exception"]["type"] == "SystemExit");
    CHECK(exiting["exception"]["message"] == "3");
    CHECK(exiting["state_lost"] == false);
    CHECK(cells.run("kept")["result"] == "1");

    // A huge message is cut, and says so.
    Json huge = cells.run("raise ValueError('v' * 200000)");
    const std::string message = huge["exception"]["message"];
    CHECK(message.size() < 70000);
    CHECK(message.find("bytes cut]") != std::string::npos);
}

TEST_CASE("run_code: a timeout interrupts the cell; one that ignores the interrupt loses the interpreter")
{
    Agent agent;
    Client client(agent);
    Cells cells{client};
    cells.run("kept = 'yes'");

    Json interrupted = cells.run("import time\ntime.sleep(30)", {{"timeout", 0.3}});
    CHECK(interrupted["timed_out"] == true);
    CHECK(interrupted["exception"]["type"] == "KeyboardInterrupt");
    CHECK(interrupted["exception"]["traceback"].get<std::string>().find("on_interrupt") == std::string::npos);
    CHECK(interrupted["state_lost"] == false);
    CHECK(cells.run("kept")["result"] == "'yes'");

    const std::string marker = "2000." + std::to_string(::getpid()) + "7";
    Json stubborn = cells.run("import signal, subprocess, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                              "subprocess.Popen(['sleep', '" + marker + "'])\ntime.sleep(30)",
                              {{"timeout", 0.3}});
    CHECK(stubborn["timed_out"] == true);
    CHECK(stubborn["state_lost"] == true);
    CHECK(stubborn["exception"]["type"] == "InterpreterDied");
    CHECK(stubborn["exception"]["message"].get<std::string>().find("signal 9") != std::string::npos);
    CHECK(stubborn["duration_ms"].get<int>() >= 2000);  // the interrupt's grace came first
    CHECK(gone(marker));  // the interpreter's processes went with it
    Json fresh = cells.run("kept");
    CHECK(fresh["exception"]["type"] == "NameError");
    CHECK(fresh["state_lost"] == false);
}

TEST_CASE("run_code: an interpreter that exits loses its state; results are cut; output streams")
{
    Agent agent;
    Client client(agent);
    Cells cells{client};
    cells.run("kept = 1");

    Json died = cells.run("import os\nos._exit(3)");
    CHECK(died["state_lost"] == true);
    CHECK(died["exception"]["type"] == "InterpreterDied");
    CHECK(died["exception"]["message"] == "the interpreter exited with status 3");
    CHECK(cells.run("kept")["exception"]["type"] == "NameError");

    Json cut = cells.run("'a' * 100", {{"max_output", 10}});
    CHECK(cut["result"] == "'aaaaaaaaa");
    CHECK(cut["result_truncated"] == true);
    // Cut at a character boundary: é is two bytes.
    CHECK(cells.run("'é' * 10", {{"max_output", 4}})["result"] == "'é");

    std::vector<Json> events;
    Json streamed = cells.run("import time\nfor i in range(3):\n    print(i)\n    time.sleep(0.05)", {{"stream", true}},
                              &events);
    std::string joined;
    for (const Json& event : events) {
        CHECK(event["event"] == "stdout");
        joined += bytes_of(event, "data");
    }
    CHECK(joined == "0\n1\n2\n");
    CHECK(bytes_of(streamed, "stdout") == joined);
}

TEST_CASE("run_code: a cell that forges the driver's status line loses the interpreter, nothing more")
{
    Agent agent;
    Client client(agent);
    Cells cells{client};
    cells.run("kept = 1");
    const std::string forge = "import os\n"
                              "for fd in os.listdir('/proc/self/fd'):\n"
                              "    try:\n"
                              "        if os.readlink('/proc/self/fd/' + fd).endswith('/status'):\n"
                              "            os.write(int(fd), PAYLOAD)\n"
                              "    except OSError:\n"
                              "        pass\n";
    for (const std::string& payload : {std::string("b'not json\\n'"), std::string("b'{\"cell\": 1000}\\n'"),
                                       std::string("b'x' * (17 << 20)")}) {
        std::string code = forge;
        code.replace(code.find("PAYLOAD"), 7, payload);
        Json forged = cells.run(code);
        CHECK_MESSAGE(forged["state_lost"] == true, payload);
        CHECK(forged["exception"]["type"] == "InterpreterDied");
        CHECK(forged["exception"]["message"].get<std::string>().find("malformed status line") != std::string::npos);
        // The next cell gets a fresh interpreter, and a clean status channel.
        CHECK(cells.run("kept")["exception"]["type"] == "NameError");
        CHECK(cells.run("kept = 2\nkept")["result"] == "2");
    }
    // A well-formed line for an earlier cell is skipped: the cell's own status still counts.
    Json stale = cells.run(std::string(forge).replace(forge.find("PAYLOAD"), 7,
                                                     "b'{\"cell\": 1, \"result\": \"5\", \"result_truncated\": false, "
                                                     "\"exception\": null}\\n'")
                           + "'mine'");
    CHECK(stale["result"] == "'mine'");
    CHECK(stale["state_lost"] == false);
    CHECK(cells.run("kept")["result"] == "2");
    CHECK(agent.alive());
}

TEST_CASE("run_code: cells take turns, beside exec calls; the interpreter outlives the connection")
{
    Agent agent;
    const std::string marker = "3000." + std::to_string(::getpid()) + "1";
    {
        Client client(agent);
        // Two cells pipelined run in order; an exec sent after them answers while the first
        // still runs: that cell waits for a file the test makes only once the exec has
        // answered, so the order holds however loaded the machine is.
        const std::string go = "/tmp/agentvm-turns-" + std::to_string(::getpid());
        std::filesystem::remove(go);
        client.send({{"id", 1},
                     {"op", "run_code"},
                     {"code", "import os, time\nwhile not os.path.exists('" + go + "'): time.sleep(0.01)\norder = [1]"}});
        client.send({{"id", 2}, {"op", "run_code"}, {"code", "order.append(2)\norder"}});
        client.send({{"id", 3}, {"op", "exec"}, {"argv", {"true"}}});
        std::vector<int> answered;
        Json second;
        for (int i = 0; i < 3; ++i) {
            Json line = client.next_line();
            answered.push_back(line["id"].get<int>());
            if (line["id"] == 2)
                second = line;
            if (line["id"] == 3)
                std::ofstream(go) << "go";
        }
        std::filesystem::remove(go);
        CHECK(answered == std::vector<int>{3, 1, 2});
        CHECK(second["result"] == "[1, 2]");

        Cells cells{client, 10};
        cells.run("import subprocess\nchild = subprocess.Popen(['sleep', '" + marker + "'])");
        CHECK(appears(marker));
    }
    // A new connection finds the same interpreter: its variables, its child still running.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK_FALSE(gone(marker));
    {
        Client client(agent);
        Cells cells{client, 20};
        CHECK(cells.run("order, child.poll()")["result"] == "([1, 2], None)");
        cells.run("child.kill(); child.wait()");
        CHECK(gone(marker));
    }
    CHECK(agent.alive());
}
