// run_code's "env" (docs/protocol.md, run_code): set for its cell alone, in a Python context's
// os.environ and a bash context's exported variables, seen by what the cell starts, and put
// back as it was afterwards, while the rest of the context's state carries on. (That the
// sandbox's env reaches cells, the cell's own names winning, is the episode relay's merge:
// tests/unit/test_episode_relay.cpp.) Needs python3 and bash on the host running the tests.
#include "tests/agent/agent_harness.hpp"

using namespace agentvm;
using namespace agentvm::agent_test;

namespace cell_env_test {

struct Cells {
    Client& client;
    int id = 0;

    Json run(const std::string& code, Json extra = Json::object())
    {
        extra["id"] = ++id;
        extra["op"] = "run_code";
        extra["code"] = code;
        return client.call(extra);
    }
    // A Python cell's value.
    std::string value(const std::string& code, Json extra = Json::object())
    {
        const Json answer = run(code, std::move(extra));
        const bool ran = answer.contains("result") && answer["exception"].is_null();
        REQUIRE_MESSAGE(ran, answer.dump());
        return answer["result"].is_null() ? "None" : answer["result"].get<std::string>();
    }
    // A bash cell's stdout.
    std::string bash(const std::string& code, Json extra = Json::object())
    {
        extra["language"] = "bash";
        const Json answer = run(code, std::move(extra));
        REQUIRE_MESSAGE(answer.value("exit_code", Json()) == 0, answer.dump());
        return bytes_of(answer, "stdout");
    }
};

TEST_CASE("a Python cell's env: in os.environ and its children's for the cell, then as it was")
{
    Agent agent;
    Client client(agent);
    Cells cells{client};
    const Json env = {{"CELL_A", "for the cell"}, {"CELL_KEPT", "temporary"}};

    CHECK(cells.value("import os, subprocess\nos.environ['CELL_KEPT'] = 'the context\\'s'\nx = 1") == "None");
    CHECK(cells.value("os.environ.get('CELL_A'), os.environ['CELL_KEPT']", {{"env", env}})
          == "('for the cell', 'temporary')");
    CHECK(cells.value("subprocess.run(['sh', '-c', 'echo $CELL_A'], capture_output=True, text=True).stdout",
                      {{"env", env}})
          == "'for the cell\\n'");
    // Gone after, or back to the context's own value; the context's other state stays.
    CHECK(cells.value("os.environ.get('CELL_A'), os.environ['CELL_KEPT'], x") == "(None, \"the context's\", 1)");
    // Put back also after a cell that failed, and whatever the cell did to those names.
    const Json failed = cells.run("os.environ['CELL_A'] = 'changed by the cell'\nraise ValueError('no')", {{"env", env}});
    CHECK(failed["exception"]["type"] == "ValueError");
    CHECK(cells.value("os.environ.get('CELL_A')") == "None");
    CHECK(cells.value("subprocess.run(['sh', '-c', 'echo ${CELL_A-unset}'], capture_output=True, text=True).stdout")
          == "'unset\\n'");
}

TEST_CASE("a bash cell's env: exported for the cell, then as it was; the context's state carries on")
{
    Agent agent;
    Client client(agent);
    Cells cells{client};
    const Json env = {{"CELL_A", "it's \"quoted\" $HOME"}, {"CELL_KEPT", "temporary"}};

    CHECK(cells.bash("CELL_KEPT=mine; cd /; x=1") == "");
    CHECK(cells.bash("echo \"$CELL_A|$CELL_KEPT\"; sh -c 'echo \"$CELL_A|$CELL_KEPT\"'; y=2", {{"env", env}})
          == "it's \"quoted\" $HOME|temporary\nit's \"quoted\" $HOME|temporary\n");
    CHECK(cells.bash("echo \"${CELL_A-unset} $CELL_KEPT $x $y $PWD\"") == "unset mine 1 2 /\n");
    // The cell's status is still its own, and the names are put back after a failing cell too.
    const Json failed = cells.run("CELL_A=changed; false", {{"language", "bash"}, {"env", env}});
    CHECK(failed["exit_code"] == 1);
    CHECK(cells.bash("echo \"${CELL_A-unset} $CELL_KEPT\"") == "unset mine\n");
    // A shell exports only names of its own kind; a Python cell takes any.
    const Json refused = cells.run("true", {{"language", "bash"}, {"env", {{"NOT-A-NAME", "1"}}}});
    REQUIRE(refused.contains("error"));
    CHECK(refused["error"]["code"] == "bad_field");
    CHECK(cells.value("import os\nos.environ['NOT-A-NAME']", {{"env", {{"NOT-A-NAME", "1"}}}}) == "'1'");
}

} // namespace cell_env_test
