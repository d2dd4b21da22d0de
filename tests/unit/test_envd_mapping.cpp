// envd's messages as service/e2b/envd_process and envd_filesystem map them onto the agent's
// calls and back: StartRequest to spawn, selectors and signals, attach events and answers to
// ProcessEvent, list_processes to ListResponse, agent entries to EntryInfo, watch events.
#include <doctest/doctest.h>

#include <string>

#include "service/e2b/envd_filesystem.hpp"
#include "service/e2b/envd_process.hpp"

using namespace agentvm;

namespace {

std::string failure_code(auto&& code)
{
    try {
        code();
    } catch (const ConnectFailure& e) {
        return e.code();
    }
    return "none";
}

} // namespace

TEST_CASE("Start as the SDK sends commands.run becomes a spawn")
{
    const Json start = Json::parse(R"({"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],
        "envs":{"A":"1"},"cwd":"/work"},"stdin":false,"tag":"t"})");
    const Json spawn = spawn_request(start, std::chrono::milliseconds(60000));
    CHECK(spawn["op"] == "spawn");
    CHECK(spawn["argv"] == Json::parse(R"(["/bin/bash","-l","-c","echo hi"])"));
    CHECK(spawn["env"] == Json::parse(R"({"A":"1"})"));
    CHECK(spawn["cwd"] == "/work");
    CHECK(spawn["stdin"] == false);
    CHECK(spawn["tag"] == "t");
    CHECK(spawn["timeout"] == 60.0);
    CHECK(spawn["replay_bytes"] == start_replay_bytes);
    CHECK_FALSE(spawn.contains("pty"));
}

TEST_CASE("Start: defaults are left to the agent, a pty is passed, snake_case is read")
{
    const Json start = Json::parse(R"({"process":{"cmd":"/bin/bash"},"pty":{"size":{"cols":"120","rows":40}}})");
    const Json spawn = spawn_request(start, std::nullopt);
    CHECK(spawn["argv"] == Json::parse(R"(["/bin/bash"])"));
    CHECK_FALSE(spawn.contains("env"));
    CHECK_FALSE(spawn.contains("cwd"));
    CHECK_FALSE(spawn.contains("timeout"));
    CHECK(spawn["pty"] == Json::parse(R"({"rows":40,"cols":120})"));
    CHECK(failure_code([] { spawn_request(Json::parse(R"({"process":{}})"), std::nullopt); }) == "invalid_argument");
    CHECK(failure_code([] { spawn_request(Json::parse(R"({"process":{"cmd":"x","args":"y"}})"), std::nullopt); }) ==
          "invalid_argument");
}

TEST_CASE("a selector names a process by pid or tag")
{
    CHECK(process_selector(MessageReader(Json::parse(R"({"process":{"pid":42}})"))) == Json::parse(R"({"pid":42})"));
    CHECK(process_selector(MessageReader(Json::parse(R"({"process":{"pid":"42"}})"))) == Json::parse(R"({"pid":42})"));
    CHECK(process_selector(MessageReader(Json::parse(R"({"process":{"tag":"web"}})"))) ==
          Json::parse(R"({"tag":"web"})"));
    CHECK(failure_code([] { process_selector(MessageReader(Json::parse(R"({"process":{}})"))); }) == "invalid_argument");
    CHECK(failure_code([] { process_selector(MessageReader(Json::parse(R"({})"))); }) == "invalid_argument");
    CHECK(failure_code([] { process_selector(MessageReader(Json::parse(R"({"process":{"pid":1,"tag":"a"}})"))); }) ==
          "invalid_argument");
    CHECK(failure_code([] { process_selector(MessageReader(Json::parse(R"({"process":{"pid":-1}})"))); }) ==
          "invalid_argument");
    // A pid no process can have is simply not found (commands.kill then returns false).
    CHECK(failure_code([] { process_selector(MessageReader(Json::parse(R"({"process":{"pid":4294967295}})"))); }) ==
          "not_found");
}

TEST_CASE("signals by name or number, KILL and TERM only")
{
    CHECK(agent_signal(MessageReader(Json::parse(R"({"signal":"SIGNAL_SIGKILL"})"))) == "KILL");
    CHECK(agent_signal(MessageReader(Json::parse(R"({"signal":15})"))) == "TERM");
    CHECK(failure_code([] { agent_signal(MessageReader(Json::parse(R"({})"))); }) == "invalid_argument");
    CHECK(failure_code([] { agent_signal(MessageReader(Json::parse(R"({"signal":"SIGNAL_SIGINT"})"))); }) ==
          "invalid_argument");
}

TEST_CASE("attach output becomes data events, bytes in base64")
{
    CHECK(*process_data_event(Json::parse(R"({"event":"stdout","data":"hello\n"})")) ==
          Json::parse(R"({"event":{"data":{"stdout":"aGVsbG8K"}}})"));
    CHECK(*process_data_event(Json::parse(R"({"event":"stderr","data_b64":"/w=="})")) ==
          Json::parse(R"({"event":{"data":{"stderr":"/w=="}}})"));
    CHECK(*process_data_event(Json::parse(R"({"event":"pty","data":"$ "})")) ==
          Json::parse(R"({"event":{"data":{"pty":"JCA="}}})"));
    CHECK_FALSE(process_data_event(Json::parse(R"({"event":"attached","pid":4})")));
    CHECK_FALSE(process_data_event(Json::parse(R"({"event":"lost","bytes":10})")));
    CHECK_FALSE(process_data_event(Json::parse(R"({"event":"stdout","data_b64":"%%"})")));
    CHECK(process_start_event(412) == Json::parse(R"({"event":{"start":{"pid":412}}})"));
}

TEST_CASE("how the process ended, as envd says it")
{
    CHECK(process_end_event(Json::parse(R"({"pid":1,"exit_code":0,"signal":null})")) ==
          Json::parse(R"({"event":{"end":{"exitCode":0,"exited":true,"status":"exit status 0"}}})"));
    CHECK(process_end_event(Json::parse(R"({"pid":1,"exit_code":3,"signal":null})")) ==
          Json::parse(R"({"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3",
                         "error":"exit status 3"}}})"));
    CHECK(process_end_event(Json::parse(R"({"pid":1,"exit_code":null,"signal":9,"timed_out":true})")) ==
          Json::parse(R"({"event":{"end":{"exitCode":-1,"exited":false,"status":"signal: killed",
                         "error":"signal: killed"}}})"));
    CHECK(exit_status_text(Json::parse(R"({"exit_code":null,"signal":15})")) == "signal: terminated");
    CHECK(exit_status_text(Json::parse(R"({"exit_code":null,"signal":11})")) == "signal: segmentation fault");
    CHECK(exit_status_text(Json::parse(R"({"exit_code":null,"signal":40})")) == "signal: signal 40");
}

TEST_CASE("List shows the running exec and spawn processes only")
{
    const Json answer = Json::parse(R"({"ok":true,"processes":[
        {"pid":5,"tag":"web","kind":"spawn","argv":["python3","-m","http.server"],"env":{"A":"1"},"cwd":"/w","running":true},
        {"pid":6,"tag":null,"kind":"exec","argv":["sleep","9"],"env":{},"cwd":null,"running":true},
        {"pid":7,"tag":null,"kind":"spawn","argv":["true"],"env":{},"cwd":null,"running":false},
        {"pid":8,"tag":null,"kind":"shell","running":true}]})");
    CHECK(process_list_response(answer) == Json::parse(R"({"processes":[
        {"config":{"cmd":"python3","args":["-m","http.server"],"envs":{"A":"1"},"cwd":"/w"},"pid":5,"tag":"web"},
        {"config":{"cmd":"sleep","args":["9"],"envs":{}},"pid":6}]})"));
    CHECK(process_list_response(Json::parse(R"({"ok":true})")) == Json::parse(R"({"processes":[]})"));
}

TEST_CASE("an agent entry becomes EntryInfo as envd writes it")
{
    const Json file = Json::parse(R"({"name":"hostname","path":"/etc/hostname","type":"file","size":8,
        "mode":"0644","mtime":1764412345.25,"uid":0,"gid":0,"owner":"root","group":"root"})");
    CHECK(*entry_info(file) == Json::parse(R"({"name":"hostname","path":"/etc/hostname","type":"FILE_TYPE_FILE",
        "size":"8","mode":420,"permissions":"-rw-r--r--","owner":"root","group":"root",
        "modifiedTime":"2025-11-29T10:32:25.250Z"})"));

    const Json deep = Json::parse(R"({"name":"sub/inner","path":"/w/sub/inner","type":"dir","size":4096,
        "mode":"1777","mtime":0})");
    const Json dir = *entry_info(deep);
    CHECK(dir["name"] == "inner");
    CHECK(dir["type"] == "FILE_TYPE_DIRECTORY");
    CHECK(dir["mode"] == 0777);
    CHECK(dir["permissions"] == "dtrwxrwxrwx");
    CHECK(dir["modifiedTime"] == "1970-01-01T00:00:00Z");

    const Json link = *entry_info(Json::parse(R"({"name":"l","path":"/w/l","type":"symlink","size":3,"mode":"0777",
        "symlink_target":"abc"})"));
    CHECK(link["type"] == "FILE_TYPE_SYMLINK");
    CHECK(link["symlinkTarget"] == "abc");
    CHECK(link["permissions"] == "Lrwxrwxrwx");

    // No type the SDK knows: left unspecified, which its list skips.
    const Json fifo = *entry_info(Json::parse(R"({"name":"p","path":"/w/p","type":"fifo","size":0,"mode":"0600"})"));
    CHECK_FALSE(fifo.contains("type"));
    CHECK(fifo["permissions"] == "prw-------");

    // A name that is not UTF-8 comes as name_b64, which a protobuf string cannot carry.
    CHECK_FALSE(entry_info(Json::parse(R"({"name_b64":"/w==","path_b64":"L3cv/w==","type":"file"})")));
    CHECK(*entry_info(Json::parse(R"({"name":"/","path":"/","type":"dir","mode":"0755"})")) ==
          Json::parse(R"({"name":"/","path":"/","type":"FILE_TYPE_DIRECTORY","mode":493,"permissions":"drwxr-xr-x"})"));
}

TEST_CASE("Go's FileMode letters, setuid and devices included")
{
    CHECK(go_permissions(04755, "file") == "urwxr-xr-x");
    CHECK(go_permissions(02755, "dir") == "dgrwxr-xr-x");
    CHECK(go_permissions(0620, "char") == "Dcrw--w----");
    CHECK(go_permissions(0660, "block") == "Drw-rw----");
    CHECK(go_permissions(0755, "socket") == "Srwxr-xr-x");
}

TEST_CASE("times in RFC 3339, as protobuf's Timestamp")
{
    CHECK(rfc3339_time(0) == "1970-01-01T00:00:00Z");
    CHECK(rfc3339_time(1764412345.5) == "2025-11-29T10:32:25.500Z");
    CHECK(rfc3339_time(1764412345.000123) == "2025-11-29T10:32:25.000123Z");
    CHECK(rfc3339_time(1764412345.9999999) == "2025-11-29T10:32:26Z");
}

TEST_CASE("watch events become WatchDirResponse")
{
    CHECK(*watch_event(Json::parse(R"({"event":"watching"})")) == Json::parse(R"({"start":{}})"));
    CHECK(*watch_event(Json::parse(R"({"event":"fs","type":"create","name":"a/b.txt"})")) ==
          Json::parse(R"({"filesystem":{"name":"a/b.txt","type":"EVENT_TYPE_CREATE"}})"));
    CHECK((*watch_event(Json::parse(R"({"event":"fs","type":"write","name":"x"})")))["filesystem"]["type"] ==
          "EVENT_TYPE_WRITE");
    CHECK((*watch_event(Json::parse(R"({"event":"fs","type":"remove","name":"x"})")))["filesystem"]["type"] ==
          "EVENT_TYPE_REMOVE");
    CHECK((*watch_event(Json::parse(R"({"event":"fs","type":"chmod","name":"x"})")))["filesystem"]["type"] ==
          "EVENT_TYPE_CHMOD");
    CHECK_FALSE(watch_event(Json::parse(R"({"event":"fs","type":"create","name_b64":"/w=="})")));
    CHECK_FALSE(watch_event(Json::parse(R"({"event":"overflow"})")));
}
