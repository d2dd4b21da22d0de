// A sandbox's history of calls: bounded, output clipped, streamed output collected, errors
// and running calls shown as docs/api.md says.
#include <doctest/doctest.h>

#include "service/call_history.hpp"

using namespace agentvm;

TEST_CASE("a call's result keeps its fields and the first bytes of its output")
{
    CallHistory history(8);
    const uint64_t seq = history.begin(Json{{"op", "exec"}, {"argv", {"echo", "hi"}}});
    CHECK(history.to_json()["calls"][0]["running"] == true);
    history.end(seq, Json{{"exit_code", 0}, {"signal", nullptr}, {"timed_out", false}, {"stdout", "hi\n"},
                          {"stderr_b64", "AP8="}, {"duration_ms", 2}});
    const Json entry = history.to_json()["calls"][0];
    CHECK(entry["seq"] == 1);
    CHECK(entry["request"]["argv"] == Json{"echo", "hi"});
    CHECK_FALSE(entry.contains("running"));
    CHECK(entry["result"]["exit_code"] == 0);
    CHECK(entry["result"]["duration_ms"] == 2);
    CHECK(entry["result"]["stdout"] == "hi\n");
    CHECK(entry["result"]["stderr_b64"] == "AP8=");  // not UTF-8: spelled as the protocol spells it
    CHECK(entry["result"]["stdout_clipped"] == false);
    CHECK(entry["started_at"].get<double>() > 1.7e9);
}

TEST_CASE("output past output_kept is clipped and said to be")
{
    CallHistory history(8);
    const uint64_t seq = history.begin(Json{{"op", "shell"}});
    history.add_output(seq, "stdout", std::string(3000, 'a'));
    history.add_output(seq, "stdout", std::string(3000, 'b'));
    history.add_output(seq, "stderr", "e");
    history.end(seq, Json{{"exit_code", 0}, {"stdout_truncated", false}});
    const Json result = history.to_json()["calls"][0]["result"];
    CHECK(result["stdout"].get<std::string>() == std::string(3000, 'a') + std::string(1096, 'b'));
    CHECK(result["stdout_clipped"] == true);
    CHECK(result["stderr"] == "e");
    CHECK(result["stderr_clipped"] == false);
}

TEST_CASE("errors are kept as errors, and the oldest calls are dropped and counted")
{
    CallHistory history(3);
    for (int i = 0; i < 5; ++i) {
        const uint64_t seq = history.begin(Json{{"op", "exec"}, {"n", i}});
        history.end(seq, Json{{"error", {{"code", "not_found"}, {"message", "no"}}}});
    }
    const Json all = history.to_json();
    CHECK(all["dropped"] == 2);
    REQUIRE(all["calls"].size() == 3);
    CHECK(all["calls"][0]["seq"] == 3);
    CHECK(all["calls"][0]["error"]["code"] == "not_found");
    CHECK_FALSE(all["calls"][0].contains("result"));
    CHECK(history.total() == 5);
    // The end of a call already dropped changes nothing.
    history.end(1, Json{{"exit_code", 1}});
    CHECK(history.to_json() == all);
}

TEST_CASE("every other field of an answer is clipped too, and said to be")
{
    // A run_code result of 1 MiB, a long traceback in an array, a deep nest: a sandbox keeps
    // up to 256 calls, so none of it may be kept whole.
    CallHistory history(8);
    const uint64_t seq = history.begin(Json{{"op", "run_code"}});
    Json deep = Json::array();
    for (int i = 0; i < 100; ++i)
        deep = Json::array({deep});
    Json many = Json::array();
    for (int i = 0; i < 100000; ++i)
        many.push_back(i);
    history.end(seq, Json{{"result", std::string(size_t{1} << 20, 'r')},
                          {"exception", {{"type", "E"}, {"traceback", many}}},
                          {"deep", deep},
                          {"timed_out", false}});
    const Json result = history.to_json()["calls"][0]["result"];
    CHECK(result.value("clipped", false) == true);
    CHECK(result.dump().size() <= CallHistory::fields_kept + 512);
    CHECK(result.value("result", "").size() < CallHistory::fields_kept);
    CHECK(result.value("result", "").starts_with("rrrr"));

    // A cut never splits a UTF-8 character (the history would not dump).
    const uint64_t utf8 = history.begin(Json{{"op", "run_code"}});
    std::string text = "x";
    for (int i = 0; i < 3000; ++i)
        text += "\xc3\xa9";  // é
    history.end(utf8, Json{{"result", text}});
    const Json kept = history.to_json()["calls"][1]["result"];
    CHECK(kept.value("clipped", false) == true);
    CHECK_NOTHROW((void)kept.dump());

    // A small answer is kept whole, without "clipped".
    const uint64_t small = history.begin(Json{{"op", "run_code"}});
    history.end(small, Json{{"result", "42"}, {"exception", nullptr}});
    const Json whole = history.to_json()["calls"][2]["result"];
    CHECK(whole["result"] == "42");
    CHECK_FALSE(whole.contains("clipped"));
}
