// Interpreter contexts on the real agent (guest/agent/contexts.hpp): several Python and bash
// interpreters per agent, each with its own state and turns, managed by create_context,
// list_contexts, restart_context and remove_context; and run_code's rich results (formats,
// display events). Needs python3 and bash on the host running the tests.
#include "tests/agent/agent_harness.hpp"

using namespace agentvm;
using namespace agentvm::agent_test;

namespace {

// Numbers its requests; one per connection.
struct ContextCalls {
    Client& client;
    int id = 0;

    Json call(Json request, std::vector<Json>* events = nullptr)
    {
        request["id"] = ++id;
        return client.call(request, events);
    }
    Json run(const std::string& code, Json extra = Json::object(), std::vector<Json>* events = nullptr)
    {
        extra["op"] = "run_code";
        extra["code"] = code;
        return call(extra, events);
    }
    Json run_in(const std::string& context, const std::string& code, Json extra = Json::object())
    {
        extra["context"] = context;
        return run(code, extra);
    }
    std::string create(Json extra = Json::object())
    {
        extra["op"] = "create_context";
        Json created = call(extra);
        REQUIRE_MESSAGE(created["ok"] == true, created.dump());
        return created["context"];
    }
    Json op(const std::string& name, const std::string& context)
    {
        return call({{"op", name}, {"context", context}});
    }
    // The listed contexts by name.
    std::map<std::string, Json> listed()
    {
        Json list = call({{"op", "list_contexts"}});
        REQUIRE(list["ok"] == true);
        std::map<std::string, Json> by_name;
        for (const Json& context : list["contexts"])
            by_name[context["context"]] = context;
        return by_name;
    }
};

std::string context_error(const Json& answer)
{
    return answer.contains("error") ? answer["error"]["code"].get<std::string>() : "";
}

// The next `count` final answers (events skipped: a cell's output may come in several), by id.
std::map<std::string, Json> final_answers(Client& client, size_t count)
{
    std::map<std::string, Json> answers;
    while (answers.size() < count) {
        Json line = client.next_line();
        if (!line.contains("event"))
            answers[line["id"]] = line;
    }
    return answers;
}

std::string agent_start_dir()
{
    return std::filesystem::current_path().string();  // the agent is forked from the test
}

} // namespace

TEST_CASE("contexts: each Python context keeps its own variables; list_contexts shows them")
{
    Agent agent;
    Client client(agent);
    ContextCalls calls{client};

    // Before any is made, "default" is the one context, and its interpreter has not started.
    auto before = calls.listed();
    REQUIRE(before.size() == 1);
    CHECK(before["default"]
          == Json{{"context", "default"}, {"language", "python"}, {"cwd", agent_start_dir()}, {"running", false}});

    Json created = calls.call({{"op", "create_context"}});
    CHECK(created
          == Json{{"id", calls.id}, {"ok", true}, {"context", "ctx-1"}, {"language", "python"},
                  {"cwd", agent_start_dir()}});
    const std::string second = calls.create({{"language", "python"}, {"cwd", agent.dir()}});
    CHECK(second == "ctx-2");

    calls.run("x = 'default'");
    calls.run_in("ctx-1", "x = 'one'");
    calls.run_in(second, "x = 'two'\nimport os");
    CHECK(calls.run("x")["result"] == "'default'");
    CHECK(calls.run("x", {{"context", "default"}, {"language", "python"}})["result"] == "'default'");
    CHECK(calls.run_in("ctx-1", "x")["result"] == "'one'");
    CHECK(calls.run_in(second, "x")["result"] == "'two'");
    // Each starts in its cwd, and counts its own cells.
    CHECK(calls.run_in(second, "os.getcwd()")["result"] == "'" + agent.dir() + "'");
    const std::string traceback = calls.run_in("ctx-1", "1/0")["exception"]["traceback"];
    CHECK(traceback.find("<cell 3>") != std::string::npos);

    auto after = calls.listed();
    CHECK(after.size() == 3);
    CHECK(after["default"]["running"] == true);
    CHECK(after["ctx-2"]["cwd"] == agent.dir());
    CHECK(after["ctx-2"]["running"] == true);
    CHECK_FALSE(after.contains("default-bash"));

    // A context is the agent's: another connection finds it with its state.
    Client other(agent);
    ContextCalls later{other};
    CHECK(later.run_in("ctx-1", "x")["result"] == "'one'");

    CHECK(context_error(calls.run_in("ctx-9", "1")) == "not_found");
    CHECK(context_error(calls.run_in("ctx-1", "1", {{"language", "bash"}})) == "bad_field");
    CHECK(context_error(calls.call({{"op", "create_context"}, {"cwd", agent.dir() + "/missing"}})) == "not_found");
    CHECK(context_error(calls.call({{"op", "create_context"}, {"cwd", "/etc/hostname"}})) == "not_found");
    CHECK(calls.listed().size() == 3);  // the refused ones made nothing
}

TEST_CASE("contexts: a bash context keeps its cwd and variables; a failing command is the cell's exception")
{
    Agent agent;
    Client client(agent);
    ContextCalls calls{client};
    const std::string bash = calls.create({{"language", "bash"}, {"cwd", agent.dir()}});

    Json pwd = calls.run_in(bash, "pwd");
    CHECK(bytes_of(pwd, "stdout") == agent.dir() + "\n");
    CHECK(pwd["exit_code"] == 0);
    CHECK(pwd["exception"].is_null());
    CHECK(pwd["result"].is_null());
    CHECK(pwd["formats"] == Json::object());
    CHECK(pwd["state_lost"] == false);

    calls.run_in(bash, "cd /tmp && export V=kept && W=also");
    CHECK(bytes_of(calls.run_in(bash, "echo $PWD $V $W", {{"language", "bash"}}), "stdout") == "/tmp kept also\n");

    Json failed = calls.run_in(bash, "echo oops >&2; false");
    CHECK(failed["exit_code"] == 1);
    CHECK(failed["exception"] == Json{{"type", "ExitCode"}, {"message", "exit code 1"}, {"traceback", nullptr}});
    CHECK(bytes_of(failed, "stderr") == "oops\n");
    CHECK(failed["state_lost"] == false);

    // Without a context, "bash" is the default bash context: another shell, made once used.
    CHECK_FALSE(calls.listed().contains("default-bash"));
    CHECK(bytes_of(calls.run("echo \"[$V]\"; V=default", {{"language", "bash"}}), "stdout") == "[]\n");
    CHECK(bytes_of(calls.run_in("default-bash", "echo $V"), "stdout") == "default\n");
    CHECK(calls.listed()["default-bash"]["language"] == "bash");
    CHECK(context_error(calls.run_in("default-bash", "1", {{"language", "python"}})) == "bad_field");
    // The shell op's bash is not a context's.
    CHECK(bytes_of(calls.call({{"op", "shell"}, {"cmd", "echo \"[$V]\""}}), "stdout") == "[]\n");

    // A shell that ends loses its state; the next cell gets a fresh one in the context's cwd.
    Json exited = calls.run_in(bash, "exit 3");
    CHECK(exited["state_lost"] == true);
    CHECK(exited["exception"]["type"] == "InterpreterDied");
    CHECK(exited["exception"]["message"] == "the shell exited with status 3");
    CHECK(bytes_of(calls.run_in(bash, "echo $PWD [$V]"), "stdout") == agent.dir() + " []\n");

    Json slow = calls.run_in(bash, "sleep 30", {{"timeout", 0.3}});
    CHECK(slow["timed_out"] == true);
    CHECK(slow["state_lost"] == true);
    CHECK(slow["exit_code"].is_null());
    CHECK(slow["exception"]["message"] == "the shell was killed by signal 9");
}

TEST_CASE("contexts: cells of different contexts run at once; one context's cells take turns")
{
    Agent agent;
    Client client(agent);
    ContextCalls calls{client};
    const std::string one = calls.create();
    const std::string two = calls.create({{"language", "bash"}});
    const std::string flag = agent.dir() + "/flag";

    // The first cell waits (at most 10 s) for a file that only a later cell, in another
    // context, makes: were contexts run one at a time, it would give up first.
    client.send({{"id", "wait"}, {"op", "run_code"}, {"context", one},
                 {"code", "import os, time\nfor _ in range(1000):\n    if os.path.exists('" + flag
                              + "'): break\n    time.sleep(0.01)\nos.path.exists('" + flag + "')"}});
    client.send({{"id", "after"}, {"op", "run_code"}, {"context", one}, {"code", "'after'"}});
    client.send({{"id", "make"}, {"op", "run_code"}, {"context", two}, {"code", "sleep 0.2; touch " + flag}});
    std::vector<std::string> order;
    std::map<std::string, Json> answers;
    for (int i = 0; i < 3; ++i) {
        Json line = client.next_line();
        order.push_back(line["id"]);
        answers[line["id"]] = line;
    }
    // The waiting cell saw the file: the other context's cell ran meanwhile. The cell behind
    // it in its own context answered last.
    CHECK(answers["wait"]["result"] == "True");
    CHECK(order.back() == "after");
    CHECK(answers["after"]["result"] == "'after'");
    CHECK(answers["make"]["exit_code"] == 0);
}

TEST_CASE("contexts: restart_context loses the state, ends a running cell, and cells read before it do not run")
{
    Agent agent;
    Client client(agent);
    ContextCalls calls{client};
    const std::string context = calls.create();
    calls.run_in(context, "x = 1");
    calls.run("kept = 1");

    Json restarted = calls.op("restart_context", context);
    CHECK(restarted == Json{{"id", calls.id}, {"ok", true}});
    CHECK(calls.run_in(context, "x")["exception"]["type"] == "NameError");
    CHECK(calls.run("kept")["result"] == "1");  // other contexts keep theirs
    CHECK(calls.op("restart_context", context)["ok"] == true);  // also when not running
    CHECK(calls.listed()[context]["running"] == false);

    // A running cell (it has printed) dies; one waiting behind it answers cancelled, unrun.
    const std::string marker = "4000." + std::to_string(::getpid()) + "3";
    client.send({{"id", "long"}, {"op", "run_code"}, {"context", context}, {"stream", true},
                 {"code", "import subprocess, time\nchild = subprocess.Popen(['sleep', '" + marker
                              + "'])\nprint('started')\ntime.sleep(30)"}});
    Json started = client.next_line();
    CHECK(started["event"] == "stdout");
    client.send({{"id", "waiting"}, {"op", "run_code"}, {"context", context}, {"code", "y = 1"}});
    client.send({{"id", "restart"}, {"op", "restart_context"}, {"context", context}});
    std::map<std::string, Json> answers = final_answers(client, 3);
    CHECK(answers["restart"]["ok"] == true);
    CHECK(answers["long"]["state_lost"] == true);
    CHECK(answers["long"]["exception"]["message"]
          == "the interpreter was killed by signal 9 (the context was restarted)");
    CHECK(answers["waiting"]["cancelled"] == true);
    CHECK(answers["waiting"]["result"].is_null());
    CHECK(gone(marker));
    CHECK(calls.run_in(context, "y")["exception"]["type"] == "NameError");
    CHECK(calls.run_in(context, "z = 2\nz")["result"] == "2");

    CHECK(context_error(calls.op("restart_context", "ctx-77")) == "not_found");
    CHECK(calls.op("restart_context", "default")["ok"] == true);
    CHECK(calls.run("kept")["exception"]["type"] == "NameError");
}

TEST_CASE("contexts: remove_context kills and forgets a context; default stays; unknown ones are not_found")
{
    Agent agent;
    Client client(agent);
    ContextCalls calls{client};
    const std::string idle = calls.create({{"language", "bash"}});
    const std::string marker = "4000." + std::to_string(::getpid()) + "5";
    calls.run_in(idle, "sleep " + marker + " &");
    CHECK(appears(marker));

    Json removed = calls.op("remove_context", idle);
    CHECK(removed == Json{{"id", calls.id}, {"ok", true}});
    CHECK(gone(marker));
    CHECK_FALSE(calls.listed().contains(idle));
    CHECK(context_error(calls.run_in(idle, "true")) == "not_found");
    CHECK(context_error(calls.op("remove_context", idle)) == "not_found");
    CHECK(context_error(calls.op("restart_context", idle)) == "not_found");
    CHECK(context_error(calls.op("remove_context", "default")) == "bad_field");
    CHECK(calls.listed().contains("default"));

    // Removed under a running cell: the cell ends, and so do its processes.
    const std::string busy = calls.create();
    const std::string busy_marker = "4000." + std::to_string(::getpid()) + "6";
    client.send({{"id", "long"}, {"op", "run_code"}, {"context", busy}, {"stream", true},
                 {"code", "import subprocess, time\nsubprocess.Popen(['sleep', '" + busy_marker
                              + "'])\nprint('started')\ntime.sleep(30)"}});
    CHECK(client.next_line()["event"] == "stdout");
    client.send({{"id", "waiting"}, {"op", "run_code"}, {"context", busy}, {"code", "1"}});
    client.send({{"id", "remove"}, {"op", "remove_context"}, {"context", busy}});
    std::map<std::string, Json> answers = final_answers(client, 3);
    CHECK(answers["remove"]["ok"] == true);
    CHECK(answers["long"]["exception"]["message"]
          == "the interpreter was killed by signal 9 (the context was removed)");
    CHECK(context_error(answers["waiting"]) == "not_found");
    CHECK(gone(busy_marker));

    // default-bash may go; asked for again, it comes back fresh.
    calls.run("X=1", {{"language", "bash"}});
    CHECK(calls.op("remove_context", "default-bash")["ok"] == true);
    CHECK_FALSE(calls.listed().contains("default-bash"));
    CHECK(bytes_of(calls.run("echo [$X]", {{"language", "bash"}}), "stdout") == "[]\n");
}

TEST_CASE("contexts: at most 16 besides the defaults")
{
    Agent agent;
    Client client(agent);
    ContextCalls calls{client};
    for (int i = 1; i <= 16; ++i)
        CHECK(calls.create() == "ctx-" + std::to_string(i));
    Json refused = calls.call({{"op", "create_context"}, {"language", "bash"}});
    CHECK(context_error(refused) == "limit");
    CHECK(refused["error"]["message"].get<std::string>().find("16") != std::string::npos);
    // The defaults do not count.
    CHECK(calls.run("true", {{"language", "bash"}})["exit_code"] == 0);
    CHECK(calls.listed().size() == 18);
    CHECK(calls.op("remove_context", "ctx-3")["ok"] == true);
    CHECK(calls.create() == "ctx-17");  // names are never reused
    CHECK(context_error(calls.call({{"op", "create_context"}})) == "limit");
}

TEST_CASE("contexts: their processes die with the agent")
{
    const std::string marker = "4000." + std::to_string(::getpid()) + "7";
    {
        Agent agent;
        Client client(agent);
        ContextCalls calls{client};
        calls.run_in(calls.create(), "import subprocess\nsubprocess.Popen(['sleep', '" + marker + "1'])");
        calls.run_in(calls.create({{"language", "bash"}}), "sleep " + marker + "2 &");
        CHECK(appears(marker + "1"));
        CHECK(appears(marker + "2"));
    }  // SIGTERM
    CHECK(gone(marker));
}

TEST_CASE("run_code: a value's rich forms come in formats; a failing or oversized form is left out")
{
    Agent agent;
    Client client(agent);
    ContextCalls calls{client};
    calls.run("class Rich:\n"
              "    def __repr__(self): return 'Rich()'\n"
              "    def _repr_html_(self): return '<b>rich</b>'\n"
              "    def _repr_png_(self): return b'\\x89PNG\\r\\n\\x1a\\n\\x00'\n"
              "class Broken:\n"
              "    def _repr_html_(self): raise ValueError('no html')\n"
              "    def _repr_markdown_(self): return '*md*'\n"
              "class Data:\n"
              "    def _repr_json_(self): return {'a': [1, 2]}\n"
              "    def _repr_mimebundle_(self, include=None, exclude=None):\n"
              "        return {'text/plain': 'data', 'application/vnd.custom+json': {'k': True}, 7: 'not a type'}\n"
              "class Huge:\n"
              "    def _repr_html_(self): return 'h' * ((1 << 20) + 1)\n"
              "    def _repr_latex_(self): return '$x$'\n");

    Json rich = calls.run("Rich()");
    CHECK(rich["result"] == "Rich()");
    const std::string png("\x89PNG\r\n\x1a\n\0", 9);
    CHECK(rich["formats"] == Json{{"text/html", "<b>rich</b>"}, {"image/png", base64_encode(png)}});
    CHECK(rich["formats_truncated"] == Json::array());

    Json broken = calls.run("Broken()");
    CHECK(broken["exception"].is_null());
    CHECK(broken["formats"] == Json{{"text/markdown", "*md*"}});

    Json data = calls.run("Data()");
    CHECK(data["formats"]
          == Json{{"text/plain", "data"},
                  {"application/vnd.custom+json", {{"k", true}}},
                  {"application/json", {{"a", {1, 2}}}}});

    Json huge = calls.run("Huge()");
    CHECK(huge["formats"] == Json{{"text/latex", "$x$"}});
    CHECK(huge["formats_truncated"] == Json::array({"text/html"}));
    // A form is bounded by max_output too, as the result is.
    Json small = calls.run("Rich()", {{"max_output", 5}});
    CHECK(small["formats"] == Json::object());
    CHECK(small["formats_truncated"] == Json::array({"text/html", "image/png"}));

    // Plain values, classes and None offer nothing.
    CHECK(calls.run("42")["formats"] == Json::object());
    CHECK(calls.run("Rich")["formats"] == Json::object());
    CHECK(calls.run("None")["formats"] == Json::object());
    // JSON nested deeper than the protocol carries is left out, not the interpreter.
    Json deep = calls.run("class Deep:\n    def _repr_json_(self):\n        v = []\n"
                          "        for _ in range(40): v = [v]\n        return v\nDeep()");
    CHECK(deep["formats_truncated"] == Json::array({"application/json"}));
    CHECK(deep["state_lost"] == false);
}

TEST_CASE("run_code: display() sends display events during the cell, bounded in number")
{
    Agent agent;
    Client client(agent);
    ContextCalls calls{client};
    calls.run("class Shown:\n"
              "    def __repr__(self): return 'Shown()'\n"
              "    def _repr_html_(self): raise RuntimeError('no')\n"
              "    def _repr_svg_(self): return '<svg/>'\n");

    std::vector<Json> events;
    Json shown = calls.run("display(Shown())\nprint('between')\ndisplay({'image/png': b'\\x00'}, raw=True)\n'done'", {},
                           &events);
    CHECK(shown["result"] == "'done'");
    CHECK(bytes_of(shown, "stdout") == "between\n");
    CHECK_FALSE(shown.contains("displays_dropped"));
    REQUIRE(events.size() == 2);
    CHECK(events[0]
          == Json{{"id", calls.id},
                  {"event", "display"},
                  {"formats", {{"image/svg+xml", "<svg/>"}, {"text/plain", "Shown()"}}},
                  {"formats_truncated", Json::array()}});
    CHECK(events[1]["formats"] == Json{{"image/png", "AA=="}});

    // Past 256 a cell, displays are dropped and counted.
    events.clear();
    Json many = calls.run("for i in range(300): display(i)", {}, &events);
    CHECK(events.size() == 256);
    CHECK(events.back()["formats"] == Json{{"text/plain", "255"}});
    CHECK(many["displays_dropped"] == 44);
    // The count starts again with each cell.
    events.clear();
    CHECK_FALSE(calls.run("display(1)", {}, &events).contains("displays_dropped"));
    CHECK(events.size() == 1);
}
