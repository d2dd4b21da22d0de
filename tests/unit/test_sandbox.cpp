// A sandbox's reading of its episode's lines, with a shell script standing in for agentvm:
// lines that are not about a running call of ours (not JSON, no id, an id of another type, an
// unknown id) are dropped and the call they would have spoofed still gets its own answer; an
// episode that ends under a call fails it with vm_died, naming agentvm's last word.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include "core/event_loop.hpp"
#include "core/loop_timer.hpp"
#include "protocol/response_line.hpp"
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
    std::vector<Json> counted;
    Sandbox sandbox(loop, "default", program.path, {}, 8,
                    Sandbox::Hooks{[&](Sandbox& s, bool) { ready = &s; },
                                   [&](Sandbox&, const std::string& why) {
                                       ended = why;
                                       loop.stop();
                                   },
                                   [&](const Json& answer, auto) { counted.push_back(answer); }});
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
    // Both counted once, the one the episode's end failed too.
    REQUIRE(counted.size() == 2);
    CHECK(counted[1]["error"]["code"] == "vm_died");
}

TEST_CASE("the env goes to the episode once, at assignment; every call of the user's is counted once, a cancel and an unrecorded one too, serve's own env op not")
{
    const FakeAgentvm program(R"(echo '{"event":"ready","restored":false}'
read env
printf '%s\n' "$env" > "$(dirname "$0")/env"
echo '{"id":1,"ok":true}'
read shell
printf '%s\n' "$shell" > "$(dirname "$0")/shell"
read unrecorded
echo '{"id":3,"mode":420}'
read cancel
echo '{"id":4,"running":true}'
echo '{"id":2,"exit_code":0,"cancelled":true}'
read last)");
    EventLoop loop;
    std::vector<Json> counted;
    std::vector<double> took;
    int answers = 0;
    Sandbox sandbox(
        loop, "default", program.path, {}, 8,
        Sandbox::Hooks{[&](Sandbox& s, bool) {
                           Sandbox::Settings settings;
                           settings.id = "sb-1";
                           settings.env = {{"A", "1"}};
                           s.assign(settings);
                           const CallHandlers handlers{[](Json&&) {}, [&](Json&&) {
                                                           if (++answers == 3)
                                                               loop.stop();
                                                       }};
                           s.call(Json{{"op", "shell"}, {"cmd", "sleep 9"}}, Json{{"op", "shell"}}, handlers);
                           s.call(Json{{"op", "stat"}, {"path", "/"}}, std::nullopt, handlers);
                           const uint64_t seq = *s.history_seq_of(2);
                           s.cancel(seq, [&](Json&&) {
                               if (++answers == 3)
                                   loop.stop();
                           });
                       },
                       [&](Sandbox&, const std::string&) { loop.stop(); },
                       [&](const Json& answer, std::chrono::duration<double> t) {
                           counted.push_back(answer);
                           took.push_back(t.count());
                       }});
    LoopTimer deadline(loop, [&] { loop.stop(); });
    deadline.arm(std::chrono::seconds(10));
    loop.run();
    REQUIRE(counted.size() == 3);
    CHECK(counted[0]["mode"] == 420);        // the stat, recorded in no history
    CHECK(counted[1]["running"] == true);    // the cancel
    CHECK(counted[2]["cancelled"] == true);  // the shell, after the env op serve sent first
    std::string line;
    std::getline(std::ifstream(program.dir + "/env"), line);
    CHECK(Json::parse(line) == Json{{"id", 1}, {"op", "env"}, {"env", {{"A", "1"}}}});
    std::getline(std::ifstream(program.dir + "/shell"), line);
    CHECK(Json::parse(line) == Json{{"id", 2}, {"op", "shell"}, {"cmd", "sleep 9"}});  // unchanged: the relay exports
    for (double t : took)
        CHECK(t >= 0.0);
}

namespace {

// Runs `program` as a sandbox's episode until it ends (60 s at most: a long line takes a
// while on a busy host), making the calls `start` makes once it is ready; returns the answers.
std::vector<Json> run_episode(const FakeAgentvm& program, const std::function<void(Sandbox&, CallHandlers)>& start,
                              std::optional<std::string>* ended = nullptr)
{
    EventLoop loop;
    std::vector<Json> answers;
    std::optional<std::string> why;
    Sandbox sandbox(loop, "default", program.path, {}, 8,
                    Sandbox::Hooks{[&](Sandbox& s, bool) {
                                       start(s, CallHandlers{[](Json&&) {},
                                                             [&](Json&& a) { answers.push_back(std::move(a)); }});
                                   },
                                   [&](Sandbox&, const std::string& w) {
                                       why = w;
                                       loop.stop();
                                   },
                                   {}});
    LoopTimer deadline(loop, [&] { loop.stop(); });
    deadline.arm(std::chrono::seconds(60));
    loop.run();
    if (ended)
        *ended = why;
    return answers;
}

// A sink that counts what serve logs.
struct CountingSink : spdlog::sinks::base_sink<std::mutex> {
    std::vector<std::string> lines;
    void sink_it_(const spdlog::details::log_msg& msg) override
    {
        lines.emplace_back(msg.payload.data(), msg.payload.size());
    }
    void flush_() override {}
};

} // namespace

TEST_CASE("a call's max_output is lowered to what serve takes in a line; an honest answer that long crosses")
{
    // 12 MiB of NULs on both streams: within the agent's default max_output, 144 MiB as a line
    // (each NUL escaped as \u0000), which the 128 MiB line cap of before broke the sandbox on.
    const FakeAgentvm program(R"(echo '{"event":"ready","restored":false}'
read first
printf '%s\n' "$first" > "$(dirname "$0")/first"
read second
printf '%s\n' "$second" > "$(dirname "$0")/second"
python3 -c '
import sys
nuls = "\\u0000" * (12 << 20)
sys.stdout.write("{\"id\":1,\"exit_code\":0,\"stdout\":\"" + nuls + "\",\"stderr\":\"" + nuls + "\"}\n")
sys.stdout.write("{\"id\":2,\"exit_code\":0}\n")
sys.stdout.flush()
'
exit 0)");
    static_assert(EpisodeProcess::max_line == max_response_line_for(EpisodeProcess::max_output_limit));
    std::optional<std::string> ended;
    const std::vector<Json> answers = run_episode(
        program,
        [](Sandbox& sandbox, CallHandlers handlers) {
            sandbox.call(Json{{"op", "exec"}, {"argv", {"true"}}, {"max_output", uint64_t{64} << 20}}, std::nullopt,
                         handlers);
            sandbox.call(Json{{"op", "shell"}, {"cmd", "true"}, {"max_output", 1000}}, std::nullopt, handlers);
        },
        &ended);
    const auto request = [&](const char* name) {
        std::ifstream file(program.dir + "/" + name);
        std::string line;
        std::getline(file, line);
        return Json::parse(line, nullptr, false);
    };
    CHECK(request("first")["max_output"] == EpisodeProcess::max_output_limit);
    CHECK(request("second")["max_output"] == 1000);
    INFO(ended.value_or("(the episode did not end)"));
    INFO((answers.empty() ? std::string() : answers[0].dump().substr(0, 300)));
    REQUIRE(answers.size() == 2);
    CHECK(answers[0].value("exit_code", -1) == 0);
    CHECK(answers[0].value("stdout", "").size() == size_t{12} << 20);
    CHECK(answers[1].value("exit_code", -1) == 0);
    REQUIRE(ended);
    CHECK(ended->find("the episode process exited with status 0") != std::string::npos);
}

TEST_CASE("stray lines from the episode are warned about at a bounded rate")
{
    const FakeAgentvm program(R"(echo '{"event":"ready","restored":false}'
i=0
while [ $i -lt 500 ]; do echo '{"id":77,"exit_code":0}'; echo 'garbage'; i=$((i+1)); done
exit 0)");
    auto sink = std::make_shared<CountingSink>();
    auto logger = std::make_shared<spdlog::logger>("count", sink);
    const auto previous = spdlog::default_logger();
    spdlog::set_default_logger(logger);
    run_episode(program, [](Sandbox&, CallHandlers) {});
    spdlog::set_default_logger(previous);
    const auto strays = std::count_if(sink->lines.begin(), sink->lines.end(), [](const std::string& line) {
        return line.find("no call of ours") != std::string::npos || line.find("not running") != std::string::npos;
    });
    CHECK(strays >= 1);
    CHECK(strays <= 20);  // of 1000
}

TEST_CASE("a call sent after the episode ended is answered vm_died, on the loop, not never")
{
    const FakeAgentvm program(R"(echo '{"event":"ready","restored":true}'
echo 'agentvm: error: the VMM was killed by signal 9' >&2
exit 4)");
    EventLoop loop;
    std::vector<Json> answers;
    bool answered_within_call = false;
    bool in_call = false;
    Sandbox sandbox(loop, "default", program.path, {}, 8,
                    Sandbox::Hooks{[](Sandbox&, bool) {},
                                   [&](Sandbox& s, const std::string&) {
                                       // A holder that still has the sandbox, as an upload
                                       // between its chunks does, sends its next call.
                                       in_call = true;
                                       s.call(Json{{"op", "write_file"}, {"path", "/tmp/x"}, {"data", "y"}},
                                              Json{{"op", "write_file"}},
                                              CallHandlers{[](Json&&) {}, [&](Json&& a) {
                                                               answered_within_call = in_call;
                                                               answers.push_back(std::move(a));
                                                               loop.stop();
                                                           }});
                                       in_call = false;
                                   },
                                   {}});
    LoopTimer deadline(loop, [&] { loop.stop(); });
    deadline.arm(std::chrono::seconds(10));
    loop.run();
    REQUIRE(answers.size() == 1);
    CHECK_FALSE(answered_within_call);
    CHECK(answers[0]["error"]["code"] == "vm_died");
    CHECK(answers[0]["error"]["message"].get<std::string>().find("killed by signal 9") != std::string::npos);
    CHECK(sandbox.running_calls() == 0);
    CHECK(sandbox.history().to_json()["calls"][0]["error"]["code"] == "vm_died");
}
