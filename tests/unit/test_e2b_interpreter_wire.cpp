// The code interpreter's wire (service/e2b/interpreter_wire.hpp): /execute's NDJSON lines as
// @e2b/code-interpreter reads them, made from the agent's run_code events and answers, and the
// request bodies and Context objects.
#include <doctest/doctest.h>

#include <algorithm>

#include "service/e2b/interpreter_wire.hpp"
#include "service/problem.hpp"

using namespace agentvm;

namespace {

Json parsed_line(const Json& line)
{
    const std::string text = ndjson_line(line);
    REQUIRE(text.ends_with("\n"));
    // One line, never blank: the SDK splits on "\n" and parses each piece.
    REQUIRE(text.find('\n') == text.size() - 1);
    REQUIRE(text.size() > 1);
    // ASCII only: the SDK decodes the body piece by piece, each piece alone, so a character
    // cut between two pieces must never happen.
    REQUIRE(std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }));
    return Json::parse(text);
}

} // namespace

TEST_CASE("stdout and stderr events become output lines, a character cut between events held back")
{
    ExecutionLines lines;
    auto out = lines.event(Json{{"event", "stdout"}, {"data", "hi\n"}}, "T1");
    REQUIRE(out.size() == 1);
    CHECK(parsed_line(out[0]) == Json{{"type", "stdout"}, {"text", "hi\n"}, {"timestamp", "T1"}});

    // "é" is C3 A9: the first event ends inside it.
    out = lines.event(Json{{"event", "stderr"}, {"data_b64", "YcM="}}, "T2");  // "a" C3
    REQUIRE(out.size() == 1);
    CHECK(out[0]["type"] == "stderr");
    CHECK(out[0]["text"] == "a");
    out = lines.event(Json{{"event", "stderr"}, {"data_b64", "qWI="}}, "T3");  // A9 "b"
    REQUIRE(out.size() == 1);
    CHECK(out[0]["text"] == "\xC3\xA9"
                            "b");

    // A lone lead byte gives no line until the rest comes; the answer flushes it.
    CHECK(lines.event(Json{{"event", "stdout"}, {"data_b64", "4oI="}}, "T4").empty());  // E2 82
    const auto closing = lines.answer(Json{{"result", nullptr}, {"exception", nullptr}}, "T5");
    REQUIRE(closing.size() == 1);
    CHECK(closing[0]["type"] == "stdout");
    // Bytes that never became UTF-8 are written as U+FFFD, still one valid JSON line.
    CHECK(parsed_line(closing[0])["text"] == "\xEF\xBF\xBD");
}

TEST_CASE("a display event is a result that is not the main one, its MIME forms under the SDK's keys")
{
    ExecutionLines lines;
    const auto out = lines.event(Json{{"event", "display"},
                                      {"formats",
                                       {{"text/plain", "'Rich'"},
                                        {"text/html", "<b>hi</b>"},
                                        {"image/png", "iVBOR"},
                                        {"application/json", {{"a", 1}}},
                                        {"application/vnd.custom+json", {1, 2}},
                                        {"type", "not a MIME type"}}},
                                      {"formats_truncated", Json::array()}},
                                 "T");
    REQUIRE(out.size() == 1);
    const Json line = parsed_line(out[0]);
    CHECK(line["type"] == "result");
    CHECK(line["is_main_result"] == false);
    CHECK(line["text"] == "Rich");  // as E2B's server shows a string's repr
    CHECK(line["html"] == "<b>hi</b>");
    CHECK(line["png"] == "iVBOR");
    CHECK(line["json"] == Json{{"a", 1}});
    CHECK(line["application/vnd.custom+json"] == Json{1, 2});
    CHECK(!line.contains("text/plain"));

    CHECK(lines.event(Json{{"event", "display"}, {"formats", Json::object()}}, "T").empty());
    CHECK(lines.event(Json{{"event", "exit"}}, "T").empty());
}

TEST_CASE("run_code's answer: the value is the main result, the exception the error")
{
    ExecutionLines lines;
    auto out = lines.answer(Json{{"result", "240"},
                                 {"formats", {{"text/html", "<i>240</i>"}, {"text/plain", "ignored"}}},
                                 {"exception", nullptr},
                                 {"state_lost", false}},
                            "T");
    REQUIRE(out.size() == 1);
    CHECK(out[0] == Json{{"type", "result"}, {"is_main_result", true}, {"text", "240"}, {"html", "<i>240</i>"}});

    out = lines.answer(Json{{"result", nullptr},
                            {"formats", Json::object()},
                            {"exception",
                             {{"type", "ZeroDivisionError"},
                              {"message", "division by zero"},
                              {"traceback", "Traceback ...\n"}}}},
                       "T");
    REQUIRE(out.size() == 1);
    CHECK(out[0] == Json{{"type", "error"},
                         {"name", "ZeroDivisionError"},
                         {"value", "division by zero"},
                         {"traceback", "Traceback ...\n"}});

    // A bash cell's non-zero status has no traceback; the SDK's is a string.
    out = lines.answer(Json{{"result", nullptr},
                            {"exception", {{"type", "ExitCode"}, {"message", "exit code 3"}, {"traceback", nullptr}}}},
                       "T");
    REQUIRE(out.size() == 1);
    CHECK(out[0]["traceback"] == "");

    out = lines.answer(Json{{"result", nullptr}, {"exception", nullptr}, {"cancelled", true}}, "T");
    REQUIRE(out.size() == 1);
    CHECK(out[0]["name"] == "CellCancelled");

    out = lines.answer(Json{{"error", {{"code", "not_found"}, {"message", "no context ctx-9"}}}}, "T");
    REQUIRE(out.size() == 1);
    CHECK(out[0] == Json{{"type", "error"}, {"name", "not_found"}, {"value", "no context ctx-9"}, {"traceback", ""}});

    CHECK(lines.answer(Json{{"result", nullptr}, {"exception", nullptr}}, "T").empty());
}

TEST_CASE("the count and the end lines")
{
    CHECK(parsed_line(executions_line(3)) == Json{{"type", "number_of_executions"}, {"execution_count", 3}});
    CHECK(parsed_line(end_of_execution_line()) == Json{{"type", "end_of_execution"}});
    const std::string stamp = line_timestamp();
    CHECK(stamp.size() == 27);  // 2026-12-05T10:00:00.000000Z
    CHECK(stamp[10] == 'T');
    CHECK(stamp.back() == 'Z');
}

TEST_CASE("E2B's language names map onto the agent's python and bash")
{
    CHECK(agent_language("python") == "python");
    CHECK(agent_language(" Python ") == "python");
    CHECK(agent_language("") == "python");
    CHECK(agent_language("BASH") == "bash");
    CHECK(!agent_language("js"));
    CHECK(!agent_language("r"));
    CHECK(unsupported_language_message("js").find("\"js\"") != std::string::npos);
}

TEST_CASE("POST /execute's body")
{
    ExecuteRequest request = parse_execute_request(Json{{"code", "x = 1"}});
    CHECK(request.code == "x = 1");
    CHECK(!request.context);
    CHECK(!request.language);
    CHECK(!request.env);

    request = parse_execute_request(
        Json{{"code", "echo $A"}, {"language", "bash"}, {"env_vars", {{"A", "1"}}}, {"context_id", nullptr}});
    CHECK(request.language == "bash");
    CHECK(request.env == Json{{"A", "1"}});

    request = parse_execute_request(Json{{"code", "1"}, {"context_id", "ctx-2"}});
    CHECK(request.context == "ctx-2");

    request = parse_execute_request(Json{{"code", "1"}, {"language", "java"}});
    CHECK(!request.language);
    CHECK(request.unsupported_language == "java");

    CHECK_THROWS_AS(parse_execute_request(Json::object()), RefusedRequest);
    CHECK_THROWS_AS(parse_execute_request(Json{{"code", 1}}), RefusedRequest);
    CHECK_THROWS_AS(parse_execute_request(Json{{"code", "1"}, {"context_id", "c"}, {"language", "python"}}),
                    RefusedRequest);
    CHECK_THROWS_AS(parse_execute_request(Json{{"code", "1"}, {"env_vars", {{"A", 1}}}}), RefusedRequest);
    CHECK_THROWS_AS(parse_execute_request(Json{{"code", "1"}, {"env_vars", "A=1"}}), RefusedRequest);
    CHECK_THROWS_AS(parse_execute_request(Json{{"code", "1"}, {"context_id", ""}}), RefusedRequest);
}

TEST_CASE("POST /contexts' body and the Context answered")
{
    ContextRequest request = parse_context_request(Json::object());
    CHECK(!request.language);
    CHECK(!request.cwd);
    request = parse_context_request(Json{{"language", "bash"}, {"cwd", "/work"}});
    CHECK(request.language == "bash");
    CHECK(request.cwd == "/work");
    CHECK_THROWS_AS(parse_context_request(Json{{"language", "javascript"}}), RefusedRequest);
    CHECK_THROWS_AS(parse_context_request(Json{{"cwd", 3}}), RefusedRequest);

    CHECK(context_json(Json{{"ok", true}, {"context", "ctx-1"}, {"language", "bash"}, {"cwd", "/work"},
                            {"running", false}})
          == Json{{"id", "ctx-1"}, {"language", "bash"}, {"cwd", "/work"}});
}
