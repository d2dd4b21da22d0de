// A sandbox's reading of its episode's lines, with a shell script standing in for agentvm:
// lines that are not about a running call of ours (not JSON, no id, an id of another type, an
// unknown id) are dropped and the call they would have spoofed still gets its own answer; an
// episode that ends under a call fails it with vm_died, naming agentvm's last word.
#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <vector>

#include "core/event_loop.hpp"
#include "core/loop_timer.hpp"
#include "service/sandbox.hpp"
#include "tests/support/fake_agentvm.hpp"

using namespace agentvm;
using agentvm::test::FakeAgentvm;

TEST_CASE("malformed and stray episode lines touch no call; the episode's end fails the pending one")
{
    const FakeAgentvm program(R"(echo '{"event":"ready","restored":true}'
read request
echo 'not json'
echo '[1,2]'
echo '{"no":"id"}'
echo '{"id":"1","exit_code":9}'
echo '{"id":-1,"exit_code":9}'
echo '{"id":999,"exit_code":9}'
echo '{"id":1,"event":"stdout","data":"hi"}'
echo '{"id":1,"exit_code":0,"signal":null,"timed_out":false,"stdout_truncated":false}'
read request
echo 'agentvm: error: the VMM was killed by signal 9' >&2
exit 4)");
    EventLoop loop;
    std::vector<Json> events;
    std::vector<Json> answers;
    std::optional<std::string> ended;
    Sandbox* ready = nullptr;
    Sandbox sandbox(loop, "default", program.path, {}, 8,
                    Sandbox::Hooks{[&](Sandbox& s, bool) { ready = &s; },
                                   [&](Sandbox&, const std::string& why) {
                                       ended = why;
                                       loop.stop();
                                   }});
    LoopTimer deadline(loop, [&] { loop.stop(); });
    deadline.arm(std::chrono::seconds(10));
    LoopTimer start_calls(loop, [&] {
        CallHandlers handlers{[&](Json&& e) { events.push_back(e); }, [&](Json&& a) { answers.push_back(a); }};
        sandbox.call(Json{{"op", "exec"}, {"argv", {"echo", "hi"}}}, Json{{"op", "exec"}}, handlers);
        sandbox.call(Json{{"op", "shell"}, {"cmd", "sleep 9"}}, Json{{"op", "shell"}}, handlers);
    });
    start_calls.arm(std::chrono::milliseconds(200));
    loop.run();

    REQUIRE(ready == &sandbox);
    REQUIRE(ended);
    CHECK(ended->find("agentvm: error: the VMM was killed by signal 9") != std::string::npos);
    REQUIRE(events.size() == 1);
    CHECK(events[0] == Json{{"event", "stdout"}, {"data", "hi"}});
    REQUIRE(answers.size() == 2);
    CHECK(answers[0]["exit_code"] == 0);  // its own answer, not the stray exit_code 9s
    CHECK(answers[1]["error"]["code"] == "vm_died");
    const Json history = sandbox.history().to_json()["calls"];
    REQUIRE(history.size() == 2);
    CHECK(history[0]["result"]["stdout"] == "hi");
    CHECK(history[1]["error"]["code"] == "vm_died");
    CHECK(sandbox.running_calls() == 0);
}
