// FileWriter: a file in 4 MiB write_file chunks, at most two in flight before it says it has
// no room, room again once an answer drains it, one history entry for the whole file, one
// writer per path, and an answer's error (or the sandbox's end) failing the file once.
#include <doctest/doctest.h>

#include <csignal>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "core/event_loop.hpp"
#include "core/loop_timer.hpp"
#include "service/file_writer.hpp"
#include "service/sandbox.hpp"
#include "tests/support/fake_agentvm.hpp"

using namespace agentvm;
using agentvm::test::FakeAgentvm;

namespace {

// An episode that answers every write_file with `answer` (its id put in), and records the
// requests it got in DIR/requests.
FakeAgentvm answering_episode(const std::string& answer)
{
    return FakeAgentvm(R"(echo '{"event":"ready","restored":false}'
exec python3 -c '
import json, os, sys
log = open(os.path.join(os.path.dirname(sys.argv[1]), "requests"), "w")
for line in sys.stdin:
    request = json.loads(line)
    log.write(json.dumps({k: (len(v) if k == "data_b64" else v) for k, v in request.items()}) + "\n")
    log.flush()
    answer = json.loads(sys.argv[2])
    answer["id"] = request["id"]
    print(json.dumps(answer), flush=True)
' "$0" ')" + answer + "'");
}

std::vector<Json> requests_of(const FakeAgentvm& program)
{
    std::vector<Json> out;
    std::ifstream file(program.dir + "/requests");
    for (std::string line; std::getline(file, line);)
        out.push_back(Json::parse(line));
    return out;
}

struct Run {
    std::optional<Json> outcome;
    int rooms = 0;
    bool full_after_write = false;
    std::optional<Refusal> second_writer;
};

Run write_file(const FakeAgentvm& program, size_t bytes)
{
    // As in serve (cli/serve_main.cpp): a chunk still queued for an episode that has been
    // killed (the test ends once the file failed) fails with EPIPE rather than killing us.
    ::signal(SIGPIPE, SIG_IGN);
    EventLoop loop;
    Run run;
    std::shared_ptr<FileWriter> writer;
    auto sandbox = std::make_shared<Sandbox>(
        loop, "default", program.path, std::vector<std::string>{}, 8,
        Sandbox::Hooks{[&](Sandbox& s, bool) {
                           Sandbox::Settings settings;
                           settings.id = "sb-1";
                           s.assign(settings);
                       },
                       [&](Sandbox&, const std::string&) { loop.stop(); },
                       {}});
    LoopTimer start(loop, [&] {
        std::optional<Refusal> refusal;
        writer = FileWriter::open(sandbox, "/f", "0600",
                                  FileWriter::Handlers{[&] { ++run.rooms; },
                                                       [&](Json&& outcome) {
                                                           run.outcome = std::move(outcome);
                                                           loop.stop();
                                                       }},
                                  refusal);
        REQUIRE(writer);
        FileWriter::open(sandbox, "/f", std::nullopt, {}, run.second_writer);
        writer->write(std::string(bytes, 'x'));
        run.full_after_write = !writer->has_room();
        writer->close();
    });
    start.arm(std::chrono::milliseconds(300));
    LoopTimer deadline(loop, [&] { loop.stop(); });
    deadline.arm(std::chrono::seconds(20));
    loop.run();
    if (run.outcome && !run.outcome->contains("error")) {
        const Json history = sandbox->history().to_json()["calls"];
        REQUIRE(history.size() == 1);
        CHECK(history[0]["request"] == Json{{"op", "write_file"}, {"path", "/f"}, {"mode", "0600"}});
        CHECK(history[0]["result"]["bytes"] == bytes);
    }
    return run;
}

} // namespace

TEST_CASE("a file goes in 4 MiB chunks, the first with its mode, the rest appended; room again once answers drain")
{
    const FakeAgentvm program = answering_episode(R"({"ok":true})");
    const size_t bytes = (size_t{4} << 20) * 3 + 5;
    const Run run = write_file(program, bytes);
    REQUIRE(run.outcome);
    CHECK(*run.outcome == Json{{"ok", true}, {"path", "/f"}, {"bytes", bytes}});
    CHECK(run.full_after_write);  // three chunks out at once: no room until answers come
    CHECK(run.rooms == 0);        // the source had ended: nobody to tell
    REQUIRE(run.second_writer);
    CHECK(run.second_writer->code == ServiceError::upload_in_progress);
    const std::vector<Json> requests = requests_of(program);
    REQUIRE(requests.size() == 4);
    CHECK(requests[0]["mode"] == "0600");
    CHECK_FALSE(requests[0].contains("append"));
    for (size_t i = 1; i < 4; ++i) {
        CHECK(requests[i]["append"] == true);
        CHECK_FALSE(requests[i].contains("mode"));
    }
    CHECK(requests[3]["data_b64"] == 8);  // 5 bytes, base64
}

TEST_CASE("an error answer fails the file once, with the agent's error")
{
    const FakeAgentvm program = answering_episode(R"({"error":{"code":"io","message":"No space left on device"}})");
    const Run run = write_file(program, size_t{9} << 20);
    REQUIRE(run.outcome);
    CHECK((*run.outcome)["error"]["code"] == "io");
}
