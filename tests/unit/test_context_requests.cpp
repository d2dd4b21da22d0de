// Parsing the context ops (protocol/context_requests.hpp) and run_code's "context" and
// "language": what parses into what, and which malformed lines get which error.
#include <doctest/doctest.h>

#include <string>

#include "protocol/agent_protocol.hpp"
#include "tests/support/request_errors.hpp"

using namespace agentvm;
using namespace agentvm::test;

namespace {

template <typename Op>
Op op_of(const std::string& line)
{
    const Request request = parse_request(line);
    REQUIRE(std::holds_alternative<Op>(request.op));
    return std::get<Op>(request.op);
}

} // namespace

TEST_CASE("create_context: language defaults to python, cwd is optional")
{
    const auto plain = op_of<CreateContextRequest>(R"({"id":1,"op":"create_context"})");
    CHECK(plain.language == CodeLanguage::python);
    CHECK_FALSE(plain.cwd);

    const auto bash = op_of<CreateContextRequest>(R"({"id":1,"op":"create_context","language":"bash","cwd":"/work"})");
    CHECK(bash.language == CodeLanguage::bash);
    CHECK(bash.cwd == std::optional<std::string>("/work"));
    CHECK(op_of<CreateContextRequest>(R"({"id":1,"op":"create_context","language":null,"cwd":null})").language
          == CodeLanguage::python);

    CHECK(request_error_code(R"({"id":1,"op":"create_context","language":"ruby"})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"create_context","language":3})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"create_context","cwd":""})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"create_context","cwd":"/a\u0000b"})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"create_context","cwd":["/"]})") == "bad_field");
}

TEST_CASE("list_contexts, restart_context and remove_context")
{
    CHECK(std::holds_alternative<ListContextsRequest>(parse_request(R"({"id":"l","op":"list_contexts"})").op));
    CHECK(op_of<RestartContextRequest>(R"({"id":2,"op":"restart_context","context":"ctx-1"})").context == "ctx-1");
    CHECK(op_of<RemoveContextRequest>(R"({"id":3,"op":"remove_context","context":"default-bash"})").context
          == "default-bash");

    for (const char* op : {"restart_context", "remove_context"}) {
        const std::string head = std::string(R"({"id":4,"op":")") + op + "\"";
        CAPTURE(op);
        CHECK(request_error_code(head + "}") == "missing_field");
        CHECK(request_error_code(head + R"(,"context":null})") == "bad_field");
        CHECK(request_error_code(head + R"(,"context":7})") == "bad_field");
        CHECK(request_error_code(head + R"(,"context":""})") == "bad_field");
        CHECK(request_error_code(head + R"(,"context":")" + std::string(max_context_name_bytes, 'c') + "\"}").empty());
        CHECK(request_error_code(head + R"(,"context":")" + std::string(max_context_name_bytes + 1, 'c') + "\"}")
              == "bad_field");
    }
}

TEST_CASE("run_code: context and language are optional; bash is a language now")
{
    const auto plain = op_of<RunCodeRequest>(R"({"id":1,"op":"run_code","code":"1"})");
    CHECK_FALSE(plain.context);
    CHECK_FALSE(plain.language);

    const auto bash = op_of<RunCodeRequest>(R"({"id":1,"op":"run_code","code":"pwd","language":"bash","timeout":2})");
    CHECK(bash.language == std::optional<CodeLanguage>(CodeLanguage::bash));
    CHECK(bash.timeout_s == std::optional<double>(2));

    const auto in_context = op_of<RunCodeRequest>(
        R"({"id":1,"op":"run_code","code":"x","context":"ctx-3","language":"python","stream":true})");
    CHECK(in_context.context == std::optional<std::string>("ctx-3"));
    CHECK(in_context.language == std::optional<CodeLanguage>(CodeLanguage::python));
    CHECK(in_context.stream);
    CHECK_FALSE(op_of<RunCodeRequest>(R"({"id":1,"op":"run_code","code":"1","context":null})").context);

    CHECK(request_error_code(R"({"id":1,"op":"run_code","code":"1","language":"ruby"})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"run_code","code":"1","context":1})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"run_code","code":"1","context":""})") == "bad_field");
    // Whether the context exists, and has that language, is the agent's to say.
    CHECK(request_error_code(R"({"id":1,"op":"run_code","code":"1","context":"nope","language":"bash"})").empty());
}

TEST_CASE("the new ops keep the id of a line they refuse")
{
    try {
        parse_request(R"({"id":"c-9","op":"restart_context"})");
        FAIL("parsed");
    } catch (const RequestError& e) {
        CHECK(e.id == "c-9");
        CHECK(e.error.code() == std::string("missing_field"));
        CHECK(std::string(e.error.what()) == "missing \"context\"");
    }
}
