// Parsing of the process ops (protocol/process_requests.hpp): spawn, attach, send_stdin,
// close_stdin, signal and resize, malformed fields refused with the field named.
#include <doctest/doctest.h>

#include <csignal>
#include <string>

#include "protocol/agent_protocol.hpp"
#include "tests/support/request_errors.hpp"

using namespace agentvm;
using namespace agentvm::test;

TEST_CASE("spawn: exec's command fields, a boolean stdin, a bounded pty and replay size")
{
    const Request ok = parse_request(
        R"({"id":1,"op":"spawn","argv":["sh"],"tag":"web","stdin":true,"pty":{"rows":30,"cols":100},"replay_bytes":65536})");
    const auto& spawn = std::get<SpawnRequest>(ok.op);
    CHECK(spawn.command.tag == "web");
    CHECK(spawn.settings.keep_stdin);
    CHECK(spawn.settings.pty->rows == 30);
    CHECK(spawn.settings.replay_bytes == 65536);
    CHECK(request_error_code(R"({"id":1,"op":"spawn"})") == "missing_field");
    CHECK(request_error_code(R"({"id":1,"op":"spawn","argv":["sh"],"stdin":"data"})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"spawn","argv":["sh"],"pty":{"rows":0,"cols":80}})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"spawn","argv":["sh"],"pty":{"rows":24,"cols":5000}})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"spawn","argv":["sh"],"pty":{"rows":24}})") == "missing_field");
    CHECK(request_error_code(R"({"id":1,"op":"spawn","argv":["sh"],"replay_bytes":1024})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"spawn","argv":["sh"],"replay_bytes":16777217})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"spawn","argv":["sh"],"tag":""})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"spawn","argv":["sh"],"tag":")" + std::string(257, 't') + R"("})") == "bad_field");
}

TEST_CASE("a process is named by pid or by tag, exactly one, and signals are the sendable ones")
{
    CHECK(std::get<int>(std::get<AttachRequest>(parse_request(R"({"id":1,"op":"attach","pid":7})").op).process) == 7);
    CHECK(request_error_code(R"({"id":1,"op":"attach"})") == "missing_field");
    CHECK(request_error_code(R"({"id":1,"op":"attach","pid":7,"tag":"web"})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"attach","pid":-3})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"attach","pid":4294967296})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"attach","pid":"7"})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"attach","tag":"web","replay":"yes"})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"send_stdin","pid":7})") == "missing_field");
    CHECK(request_error_code(R"({"id":1,"op":"send_stdin","pid":7,"data_b64":"%%%"})") == "bad_field");
    CHECK(std::get<SignalRequest>(parse_request(R"({"id":1,"op":"signal","pid":7,"signal":"SIGTERM"})").op).signal
          == SIGTERM);
    CHECK(std::get<SignalRequest>(parse_request(R"({"id":1,"op":"signal","pid":7,"signal":9,"group":true})").op).group);
    CHECK(request_error_code(R"({"id":1,"op":"signal","pid":7,"signal":"SEGV"})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"signal","pid":7,"signal":11})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"signal","pid":7})") == "missing_field");
    CHECK(request_error_code(R"({"id":1,"op":"resize","pid":7,"rows":24,"cols":0})") == "bad_field");
}
