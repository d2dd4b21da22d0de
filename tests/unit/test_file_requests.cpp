// Parsing of the file ops (protocol/file_requests.hpp): make_dir, move, remove, watch and
// list_dir's depth, through parse_request as the agent and the episode relay call it.
#include <doctest/doctest.h>

#include <string>

#include "protocol/agent_protocol.hpp"
#include "tests/support/request_errors.hpp"

using namespace agentvm;
using namespace agentvm::test;

namespace {

template <typename Op>
Op parsed(const std::string& line)
{
    const Request request = parse_request(line);
    REQUIRE(std::holds_alternative<Op>(request.op));
    return std::get<Op>(request.op);
}

} // namespace

TEST_CASE("make_dir: path and an optional exact mode")
{
    const auto make = parsed<MakeDirRequest>(R"({"id":1,"op":"make_dir","path":"/work/a/b","mode":"0750"})");
    CHECK(make.path == "/work/a/b");
    CHECK(make.mode == std::optional<uint32_t>(0750));
    CHECK_FALSE(parsed<MakeDirRequest>(R"({"id":1,"op":"make_dir","path":"/w","mode":null})").mode);
    CHECK(default_make_dir_mode == 0755);

    CHECK(request_error_code(R"({"id":1,"op":"make_dir"})") == "missing_field");
    CHECK(request_error_code(R"({"id":1,"op":"make_dir","path":7})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"make_dir","path":""})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"make_dir","path":"/a\u0000b"})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"make_dir","path":"/a","mode":"0855"})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"make_dir","path":"/a","mode":493})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"make_dir","path":"/a","mode":"17777"})") == "bad_field");
}

TEST_CASE("move: from and to, both required paths")
{
    const auto move = parsed<MoveRequest>(R"({"id":2,"op":"move","from":"/a","to":"/b"})");
    CHECK(move.from == "/a");
    CHECK(move.to == "/b");
    CHECK(request_error(R"({"id":2,"op":"move","to":"/b"})") == "missing_field: missing \"from\"");
    CHECK(request_error(R"({"id":2,"op":"move","from":"/a"})") == "missing_field: missing \"to\"");
    CHECK(request_error_code(R"({"id":2,"op":"move","from":"/a","to":""})") == "bad_field");
    CHECK(request_error_code(R"({"id":2,"op":"move","from":"/a\u0000","to":"/b"})") == "bad_field");
    CHECK(request_error_code(R"({"id":2,"op":"move","from":["/a"],"to":"/b"})") == "bad_field");
}

TEST_CASE("remove: path and recursive, false by default")
{
    CHECK_FALSE(parsed<RemoveRequest>(R"({"id":3,"op":"remove","path":"/a"})").recursive);
    const auto remove = parsed<RemoveRequest>(R"({"id":3,"op":"remove","path":"/a","recursive":true})");
    CHECK(remove.path == "/a");
    CHECK(remove.recursive);
    CHECK(request_error_code(R"({"id":3,"op":"remove","path":"/a","recursive":"yes"})") == "bad_field");
    CHECK(request_error_code(R"({"id":3,"op":"remove","path":"/a","recursive":1})") == "bad_field");
    CHECK(request_error_code(R"({"id":3,"op":"remove","recursive":true})") == "missing_field");
}

TEST_CASE("watch: path and recursive, false by default")
{
    const auto watch = parsed<WatchRequest>(R"({"id":4,"op":"watch","path":"/work","recursive":true})");
    CHECK(watch.path == "/work");
    CHECK(watch.recursive);
    CHECK_FALSE(parsed<WatchRequest>(R"({"id":4,"op":"watch","path":"/work"})").recursive);
    CHECK(request_error_code(R"({"id":4,"op":"watch"})") == "missing_field");
    CHECK(request_error_code(R"({"id":4,"op":"watch","path":"/w","recursive":"true"})") == "bad_field");
    // The error keeps the request's id, so the client can match it.
    try {
        parse_request(R"({"id":"w-1","op":"watch","path":""})");
        FAIL("an empty path parsed");
    } catch (const RequestError& e) {
        CHECK(e.id == "w-1");
    }
}

TEST_CASE("list_dir: depth from 1 to 64, 1 by default")
{
    CHECK(parsed<ListDirRequest>(R"({"id":5,"op":"list_dir","path":"/"})").depth == 1);
    CHECK(parsed<ListDirRequest>(R"({"id":5,"op":"list_dir","path":"/","depth":null})").depth == 1);
    CHECK(parsed<ListDirRequest>(R"({"id":5,"op":"list_dir","path":"/","depth":64})").depth == 64);
    const auto list = parsed<ListDirRequest>(R"({"id":5,"op":"list_dir","path":"/w","depth":3,"max_entries":7})");
    CHECK(list.depth == 3);
    CHECK(list.max_entries == 7);
    CHECK(request_error(R"({"id":5,"op":"list_dir","path":"/","depth":0})")
          == "bad_field: \"depth\" must be an integer from 1 to 64");
    CHECK(request_error_code(R"({"id":5,"op":"list_dir","path":"/","depth":65})") == "bad_field");
    CHECK(request_error_code(R"({"id":5,"op":"list_dir","path":"/","depth":-1})") == "bad_field");
    CHECK(request_error_code(R"({"id":5,"op":"list_dir","path":"/","depth":2.5})") == "bad_field");
    CHECK(request_error_code(R"({"id":5,"op":"list_dir","path":"/","depth":"2"})") == "bad_field");
}
