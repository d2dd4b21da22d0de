// How `agentvm snapshot bake` judges the guest agent's answers (episode/bake_calls.hpp): the
// guest is a template's, i.e. the user's, so every malformed answer must fail the bake with a
// message and never throw out of the VMM's loop.
#include <doctest/doctest.h>

#include <string>

#include "episode/bake_calls.hpp"

using namespace agentvm;

TEST_CASE("the bake runs --run, then --warm-up, then its own warm-up calls, then closes")
{
    const std::vector<BakeCall> calls = bake_calls({"make", "make install"}, {"python3 -c 1"}, 90);
    REQUIRE(calls.size() == 6);
    CHECK(calls[0].call["id"] == "agentvm--run-1");
    CHECK(calls[0].call["argv"] == Json::array({"/bin/sh", "-c", "make"}));
    CHECK(calls[0].call["timeout"] == 90);
    CHECK(calls[0].call["max_output"] == bake_step_output_bytes);
    CHECK(calls[1].what == "--run 2 (make install)");
    CHECK(calls[2].call["id"] == "agentvm--warm-up-1");
    CHECK(!calls[2].may_be_missing);
    CHECK(calls[3].log_writes);
    CHECK(calls[3].may_be_missing);
    CHECK(calls[4].call["op"] == "shell");
    CHECK(calls[5].closes);
}

TEST_CASE("an answer passes only with its id and a zero exit code, or ok for the close")
{
    const std::vector<BakeCall> calls = bake_calls({"step"}, {}, 90);
    const BakeCall& step = calls[0];
    const BakeCall& warm = calls[1];
    const BakeCall& close = calls.back();
    CHECK(failure_of(step, R"({"id":"agentvm--run-1","exit_code":0})").empty());
    CHECK(failure_of(close, R"({"id":"agentvm-bake","ok":true})").empty());
    // Ours may find the program missing in a busybox or distroless image; the user's may not.
    CHECK(failure_of(warm, R"({"id":"agentvm-warm-exec","error":{"code":"not_found","message":"true"}})").empty());
    CHECK(failure_of(step, R"({"id":"agentvm--run-1","error":{"code":"not_found","message":"sh"}})")
              .find("--run 1 (step) failed in the guest") != std::string::npos);

    const std::string failed =
        failure_of(step, R"({"id":"agentvm--run-1","exit_code":7,"signal":null,"timed_out":true,"stdout":"out","stderr":"err"})");
    CHECK(failed.find("exit code 7") != std::string::npos);
    CHECK(failed.find("(timed out)") != std::string::npos);
    CHECK(failed.find("stdout:\nout") != std::string::npos);
    CHECK(failed.find("stderr:\nerr") != std::string::npos);
}

TEST_CASE("malformed answers fail the bake with a message, whatever their types")
{
    const std::vector<BakeCall> calls = bake_calls({"step"}, {}, 90);
    const BakeCall& step = calls[0];
    const BakeCall& warm = calls[1];
    const BakeCall& close = calls.back();
    const std::string long_garbage(100000, 'x');
    for (const std::string& line :
         {std::string(""), std::string("not json"), std::string("[1,2]"), std::string("null"),
          std::string(R"({"id":"other","exit_code":0})"), std::string(R"({"exit_code":0})"),
          std::string(R"({"id":"agentvm--run-1"})"), std::string(R"({"id":"agentvm--run-1","exit_code":"0"})"),
          std::string(R"({"id":"agentvm--run-1","exit_code":0.5})"),
          std::string(R"({"id":"agentvm--run-1","exit_code":1,"stdout":5,"stderr":[1],"timed_out":"yes"})"),
          std::string(R"({"id":"agentvm--run-1","error":"flat"})"),
          std::string(R"({"id":"agentvm--run-1","error":null})"), long_garbage}) {
        std::string why;
        CHECK_NOTHROW(why = failure_of(step, line));
        CHECK_MESSAGE(!why.empty(), line.substr(0, 80));
        CHECK_MESSAGE(why.size() < 2000, line.substr(0, 80));
    }
    for (const std::string& line : {std::string(R"({"id":"agentvm-warm-exec","error":{"code":7}})"),
                                    std::string(R"({"id":"agentvm-warm-exec","error":{"code":"not_found","message":[]}})"),
                                    std::string(R"({"id":"agentvm-warm-exec","error":[]})")}) {
        std::string why = "unset";
        CHECK_NOTHROW(why = failure_of(warm, line));
        // A not_found with a message of another type is still a not_found.
        CHECK_MESSAGE(why.empty() == (line.find("not_found") != std::string::npos), line);
    }
    for (const std::string& line : {std::string(R"({"id":"agentvm-bake","ok":"true"})"),
                                    std::string(R"({"id":"agentvm-bake","ok":false})"), std::string(R"({"id":"agentvm-bake"})")}) {
        std::string why;
        CHECK_NOTHROW(why = failure_of(close, line));
        CHECK_MESSAGE(why.find("did not close") != std::string::npos, line);
    }
}
