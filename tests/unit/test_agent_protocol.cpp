#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <utility>

#include <string>
#include <vector>

#include "common/base64.hpp"
#include "protocol/line_framer.hpp"
#include "guest/agent/listen_address.hpp"
#include "protocol/agent_protocol.hpp"
#include "tests/support/request_errors.hpp"
#include "protocol/utf8.hpp"
#include "common/error.hpp"

using namespace agentvm;
using namespace agentvm::test;

namespace {

Json id_of_error(const std::string& line)
{
    try {
        parse_request(line);
    } catch (const RequestError& e) {
        return e.id;
    }
    FAIL("line parsed: " << line);
    return nullptr;
}

std::string all_bytes()
{
    std::string bytes;
    for (int i = 0; i < 256; ++i)
        bytes += static_cast<char>(i);
    return bytes;
}

struct FramerLog {
    std::vector<std::string> lines;
    int too_long = 0;
    LineFramer framer;

    explicit FramerLog(size_t max)
        : framer(max, [this](std::string&& line) { lines.push_back(std::move(line)); },
              [this] { ++too_long; })
    {
    }
};

} // namespace

TEST_CASE("base64 round-trips every length and byte value")
{
    const std::string bytes = all_bytes();
    for (size_t len = 0; len <= bytes.size(); ++len) {
        const std::string in = bytes.substr(256 - len);
        const std::string encoded = base64_encode(in);
        CHECK(encoded.size() == (len + 2) / 3 * 4);
        const auto decoded = base64_decode(encoded);
        REQUIRE(decoded);
        CHECK(*decoded == in);
    }
}

TEST_CASE("base64 matches RFC 4648 test vectors")
{
    const std::pair<const char*, const char*> vectors[] = {
        {"", ""}, {"f", "Zg=="}, {"fo", "Zm8="}, {"foo", "Zm9v"},
        {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"},
    };
    for (const auto& [plain, encoded] : vectors) {
        CHECK(base64_encode(plain) == encoded);
        CHECK(base64_decode(encoded) == std::optional<std::string>(plain));
    }
}

TEST_CASE("base64 rejects malformed input")
{
    for (const char* bad : {"Z", "Zm9", "Zm9v\n", "Zm 9", "Z===", "=Zm9", "Zg==Zm9v", "Zm-_", "Zm9v====", "Z=g="})
        CHECK_MESSAGE(!base64_decode(bad), bad);
}

TEST_CASE("base64 refuses non-canonical spellings: one value, one text")
{
    // Bits after the last byte that are not zero ("Zg==" and "Zm8=" are canonical), and
    // whitespace that a lenient decoder skips.
    for (const char* bad : {"Zh==", "Zm9=", " Zm9", "Zm9v\n\n\n\n", "Zm\t9v   "})
        CHECK_MESSAGE(!base64_decode(bad), bad);
    CHECK(base64_decode("Zg==") == std::optional<std::string>("f"));
    CHECK(base64_decode("Zm8=") == std::optional<std::string>("fo"));
}

TEST_CASE("UTF-8 validation follows RFC 3629")
{
    CHECK(is_valid_utf8(""));
    CHECK(is_valid_utf8("plain ascii\n\t"));
    CHECK(is_valid_utf8(std::string("nul\0inside", 10)));
    CHECK(is_valid_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
    CHECK(is_valid_utf8("\xf4\x8f\xbf\xbf")); // U+10FFFF
    CHECK_FALSE(is_valid_utf8("\xff"));
    CHECK_FALSE(is_valid_utf8("\x80"));
    CHECK_FALSE(is_valid_utf8("\xc3"));            // truncated
    CHECK_FALSE(is_valid_utf8("\xc0\xaf"));        // overlong '/'
    CHECK_FALSE(is_valid_utf8("\xe0\x80\xaf"));    // overlong
    CHECK_FALSE(is_valid_utf8("\xed\xa0\x80"));    // surrogate U+D800
    CHECK_FALSE(is_valid_utf8("\xf4\x90\x80\x80")); // above U+10FFFF
    CHECK_FALSE(is_valid_utf8("\xe2\x82"));        // truncated at the end
    CHECK_FALSE(is_valid_utf8("\xe2\x28\xa1"));    // bad continuation
}

TEST_CASE("put_bytes picks the plain name for UTF-8 and _b64 otherwise")
{
    Json object = Json::object();
    put_bytes(object, "stdout", "h\xc3\xa9llo");
    put_bytes(object, "stderr", std::string("\x00\xff", 2));
    CHECK(object["stdout"] == "h\xc3\xa9llo");
    CHECK_FALSE(object.contains("stdout_b64"));
    CHECK(object["stderr_b64"] == "AP8=");
    CHECK_FALSE(object.contains("stderr"));
    // Whatever it picked, the line is valid JSON that reads back to the same bytes.
    const Json again = Json::parse(to_line(object));
    CHECK(get_bytes(again, "stdout") == std::optional<std::string>("h\xc3\xa9llo"));
    CHECK(get_bytes(again, "stderr") == std::optional<std::string>(std::string("\x00\xff", 2)));
}

TEST_CASE("get_bytes accepts either spelling, but not both, and checks base64")
{
    CHECK(get_bytes(Json::parse(R"({"data":"x"})"), "data") == std::optional<std::string>("x"));
    CHECK(get_bytes(Json::parse(R"({"data_b64":"eA=="})"), "data") == std::optional<std::string>("x"));
    CHECK_FALSE(get_bytes(Json::parse(R"({"other":1})"), "data"));
    CHECK_THROWS_AS(get_bytes(Json::parse(R"({"data":"x","data_b64":"eA=="})"), "data"), CallError);
    CHECK_THROWS_AS(get_bytes(Json::parse(R"({"data_b64":"not base64!"})"), "data"), CallError);
    CHECK_THROWS_AS(get_bytes(Json::parse(R"({"data":5})"), "data"), CallError);
}

TEST_CASE("exec requests parse with defaults and every option")
{
    Request minimal = parse_request(R"({"id":1,"op":"exec","argv":["true"]})");
    CHECK(minimal.id == 1);
    auto& plain = std::get<ExecRequest>(minimal.op);
    CHECK(plain.argv == std::vector<std::string>{"true"});
    CHECK(plain.env.empty());
    CHECK_FALSE(plain.cwd);
    CHECK_FALSE(plain.stdin_data);
    CHECK_FALSE(plain.timeout_s);
    CHECK(plain.max_output == default_max_output);
    CHECK_FALSE(plain.stream);

    Request full = parse_request(R"({"id":"a-7","op":"exec","argv":["sh","-c","cat"],)"
                                 R"("env":{"A":"1","B":""},"cwd":"/tmp","stdin_b64":"AP8=",)"
                                 R"("timeout":1.5,"max_output":1024,"stream":true})");
    CHECK(full.id == "a-7");
    auto& exec = std::get<ExecRequest>(full.op);
    CHECK(exec.argv.size() == 3);
    CHECK(exec.env.at("A") == "1");
    CHECK(exec.env.at("B") == "");
    CHECK(exec.cwd == std::optional<std::string>("/tmp"));
    CHECK(exec.stdin_data == std::optional<std::string>(std::string("\x00\xff", 2)));
    CHECK(exec.timeout_s == std::optional<double>(1.5));
    CHECK(exec.max_output == 1024);
    CHECK(exec.stream);
    CHECK(exec.output_in_response);
    CHECK(plain.output_in_response);

    Request only = parse_request(R"({"id":1,"op":"exec","argv":["true"],"stream":"only"})");
    CHECK(std::get<ExecRequest>(only.op).stream);
    CHECK_FALSE(std::get<ExecRequest>(only.op).output_in_response);
    for (const char* bad : {R"("yes")", "1", R"("")", R"(["only"])"})
        CHECK(request_error_code(std::string(R"({"id":1,"op":"exec","argv":["true"],"stream":)") + bad + "}")
              == "bad_field");
}

TEST_CASE("shell requests parse")
{
    Request request = parse_request(R"({"id":9,"op":"shell","cmd":"cd /tmp && ls","timeout":2,"stream":true})");
    auto& shell = std::get<ShellRequest>(request.op);
    CHECK(shell.cmd == "cd /tmp && ls");
    CHECK(shell.timeout_s == std::optional<double>(2));
    CHECK(shell.max_output == default_max_output);
    CHECK(shell.stream);
    CHECK(shell.output_in_response);
    CHECK_FALSE(std::get<ShellRequest>(parse_request(R"({"id":1,"op":"shell","cmd":"ls","stream":"only"})").op)
                    .output_in_response);
    CHECK(request_error_code(R"({"id":1,"op":"shell"})") == "missing_field");
    CHECK(request_error_code(R"({"id":1,"op":"shell","cmd":["ls"]})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"shell","cmd":"a\u0000b"})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"shell","cmd":"cat","stdin":"x"})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"shell","cmd":"ls","timeout":0})") == "bad_field");
}

TEST_CASE("file and close requests parse")
{
    auto write = std::get<WriteFileRequest>(
        parse_request(R"({"id":2,"op":"write_file","path":"/f","data_b64":"AAE=","mode":"0755","append":true})").op);
    CHECK(write.path == "/f");
    CHECK(write.data == std::string("\x00\x01", 2));
    CHECK(write.mode == std::optional<uint32_t>(0755));
    CHECK(write.append);
    auto plain = std::get<WriteFileRequest>(parse_request(R"({"id":2,"op":"write_file","path":"/f","data":""})").op);
    CHECK(plain.data.empty());
    CHECK_FALSE(plain.mode);
    CHECK_FALSE(plain.append);
    CHECK(std::get<ReadFileRequest>(parse_request(R"({"id":3,"op":"read_file","path":"/g"})").op).path == "/g");
    CHECK(std::holds_alternative<CloseRequest>(parse_request(R"({"id":4,"op":"close"})").op));
}

TEST_CASE("run_code, stat, list_dir and cancel requests parse")
{
    auto run = std::get<RunCodeRequest>(
        parse_request(R"({"id":1,"op":"run_code","code":"x = 1\nx","language":"python","timeout":5,"max_output":9,"stream":"only"})")
            .op);
    CHECK(run.code == "x = 1\nx");
    CHECK(run.timeout_s == std::optional<double>(5));
    CHECK(run.max_output == 9);
    CHECK(run.stream);
    CHECK_FALSE(run.output_in_response);
    CHECK(std::get<RunCodeRequest>(parse_request(R"({"id":1,"op":"run_code","code":""})").op).max_output
          == default_max_output);
    CHECK(request_error_code(R"({"id":1,"op":"run_code"})") == "missing_field");
    CHECK(request_error_code(R"({"id":1,"op":"run_code","code":3})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"run_code","code":"a\u0000b"})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"run_code","code":"1","language":"ruby"})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"run_code","code":"1","timeout":0})") == "bad_field");

    CHECK(std::get<StatRequest>(parse_request(R"({"id":2,"op":"stat","path":"/etc"})").op).path == "/etc");
    CHECK(request_error_code(R"({"id":2,"op":"stat"})") == "missing_field");

    auto list = std::get<ListDirRequest>(parse_request(R"({"id":3,"op":"list_dir","path":"/","max_entries":100000})").op);
    CHECK(list.path == "/");
    CHECK(list.max_entries == max_list_entries);
    CHECK(std::get<ListDirRequest>(parse_request(R"({"id":3,"op":"list_dir","path":"/"})").op).max_entries
          == default_list_entries);
    CHECK(request_error_code(R"({"id":3,"op":"list_dir","path":"/","max_entries":0})") == "bad_field");
    CHECK(request_error_code(R"({"id":3,"op":"list_dir","path":"/","max_entries":100001})") == "bad_field");
    CHECK(request_error_code(R"({"id":3,"op":"list_dir","path":"/","max_entries":"5"})") == "bad_field");

    CHECK(std::get<CancelRequest>(parse_request(R"({"id":4,"op":"cancel","call":"up-1"})").op).call == "up-1");
    CHECK(std::get<CancelRequest>(parse_request(R"({"id":4,"op":"cancel","call":7})").op).call == 7);
    CHECK(request_error_code(R"({"id":4,"op":"cancel"})") == "missing_field");
    CHECK(request_error_code(R"({"id":4,"op":"cancel","call":[7]})") == "bad_field");
}

TEST_CASE("a call's user: on exec, spawn and every file call, 1-64 bytes without ':', newline or NUL")
{
    // Each op with the fields it needs besides "user", and how to read the user back.
    const std::vector<std::pair<std::string, std::function<std::optional<std::string>(const Request&)>>> ops = {
        {R"("op":"exec","argv":["id"])", [](const Request& r) { return std::get<ExecRequest>(r.op).user; }},
        {R"("op":"spawn","argv":["id"])", [](const Request& r) { return std::get<SpawnRequest>(r.op).command.user; }},
        {R"("op":"stat","path":"/")", [](const Request& r) { return std::get<StatRequest>(r.op).user; }},
        {R"("op":"list_dir","path":"/")", [](const Request& r) { return std::get<ListDirRequest>(r.op).user; }},
        {R"("op":"make_dir","path":"/a")", [](const Request& r) { return std::get<MakeDirRequest>(r.op).user; }},
        {R"("op":"move","from":"/a","to":"/b")", [](const Request& r) { return std::get<MoveRequest>(r.op).user; }},
        {R"("op":"remove","path":"/a")", [](const Request& r) { return std::get<RemoveRequest>(r.op).user; }},
        {R"("op":"watch","path":"/a")", [](const Request& r) { return std::get<WatchRequest>(r.op).user; }},
        {R"("op":"read_file","path":"/a")", [](const Request& r) { return std::get<ReadFileRequest>(r.op).user; }},
        {R"("op":"write_file","path":"/a","data":"")",
         [](const Request& r) { return std::get<WriteFileRequest>(r.op).user; }},
    };
    const std::string longest(max_user_name_bytes, 'u');
    for (const auto& op : ops) {
        const std::string& fields = op.first;
        const auto& user_of = op.second;
        CAPTURE(fields);
        const std::string head = R"({"id":1,)" + fields;
        CHECK_FALSE(user_of(parse_request(head + "}")));
        CHECK_FALSE(user_of(parse_request(head + R"(,"user":null})")));
        CHECK(user_of(parse_request(head + R"(,"user":"user"})")) == std::optional<std::string>("user"));
        CHECK(user_of(parse_request(head + R"(,"user":"root"})")) == std::optional<std::string>("root"));
        CHECK(user_of(parse_request(head + R"(,"user":")" + longest + "\"}")) == longest);
        const std::vector<std::string> refused = {R"("")",    R"(")" + longest + R"(u")", R"("a:b")", R"("a\nb")",
                                                  R"("a\u0000b")", "7", "[\"user\"]", "true"};
        for (const std::string& bad : refused) {
            CAPTURE(bad);
            CHECK(request_error_code(head + R"(,"user":)" + bad + "}") == "bad_field");
        }
    }
    try {
        parse_request(R"({"id":1,"op":"exec","argv":["id"],"user":"a:b"})");
        FAIL("a user with ':' parsed");
    } catch (const RequestError& e) {
        CHECK(std::string(e.error.what()).find("\"user\"") != std::string::npos);
    }
}

TEST_CASE("run_code's env: an object of strings, as exec's")
{
    const auto run = std::get<RunCodeRequest>(
        parse_request(R"({"id":1,"op":"run_code","code":"1","env":{"A":"1","lower_b":"two words"}})").op);
    CHECK(run.env == std::map<std::string, std::string>{{"A", "1"}, {"lower_b", "two words"}});
    CHECK(std::get<RunCodeRequest>(parse_request(R"({"id":1,"op":"run_code","code":"1"})").op).env.empty());
    CHECK(std::get<RunCodeRequest>(parse_request(R"({"id":1,"op":"run_code","code":"1","env":null})").op).env.empty());
    for (const std::string bad : {R"(["A"])", R"("A=1")", R"({"A":1})", R"({"A":null})", R"({"A=B":"1"})",
                                  R"({"":"1"})", R"({"A\u0000":"1"})", R"({"A":"x\u0000y"})"}) {
        CAPTURE(bad);
        CHECK(request_error_code(R"({"id":1,"op":"run_code","code":"1","env":)" + bad + "}") == "bad_field");
    }
}

TEST_CASE("malformed requests get the documented error codes")
{
    CHECK(request_error_code("") == "bad_json");
    CHECK(request_error_code("not json") == "bad_json");
    CHECK(request_error_code(R"({"id":1,"op":"exec")") == "bad_json");
    CHECK(request_error_code("\"\xff\"") == "bad_json"); // invalid UTF-8 inside a string
    CHECK(request_error_code("[1,2]") == "bad_json");
    // Beyond a double's range: nlohmann reports out_of_range, not parse_error (found by fuzzing).
    CHECK(request_error_code(R"({"id":1,"op":"exec","argv":["true"],"timeout":1e999})") == "bad_json");
    CHECK(request_error_code(R"({"op":"exec","argv":["x"]})") == "missing_field");
    CHECK(request_error_code(R"({"id":[1],"op":"close"})") == "bad_field");
    CHECK(request_error_code(R"({"id":1})") == "missing_field");
    CHECK(request_error_code(R"({"id":1,"op":5})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"reboot"})") == "unknown_op");
    CHECK(request_error_code(R"({"id":1,"op":"exec"})") == "missing_field");
    CHECK(request_error_code(R"({"id":1,"op":"exec","argv":[]})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"exec","argv":"ls"})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"exec","argv":["ls",3]})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"exec","argv":[""]})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"exec","argv":["a\u0000b"]})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"exec","argv":["x"],"env":["A=1"]})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"exec","argv":["x"],"env":{"A=B":"1"}})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"exec","argv":["x"],"env":{"A":1}})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"exec","argv":["x"],"cwd":7})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"exec","argv":["x"],"timeout":0})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"exec","argv":["x"],"timeout":-1})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"exec","argv":["x"],"timeout":"5"})") == "bad_field");
    // A deadline in nanoseconds would overflow (found by fuzzing the host relay under UBSan).
    CHECK(request_error_code(R"({"id":1,"op":"exec","argv":["x"],"timeout":1e300})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"exec","argv":["x"],"timeout":31536001})") == "bad_field");
    CHECK(std::holds_alternative<ExecRequest>(parse_request(R"({"id":1,"op":"exec","argv":["x"],"timeout":31536000})").op));
    CHECK(request_error_code(R"({"id":1,"op":"exec","argv":["x"],"max_output":-1})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"exec","argv":["x"],"max_output":1.5})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"exec","argv":["x"],"stream":"yes"})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"exec","argv":["x"],"stdin":"a","stdin_b64":"YQ=="})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"write_file","data":"x"})") == "missing_field");
    CHECK(request_error_code(R"({"id":1,"op":"write_file","path":"/f"})") == "missing_field");
    CHECK(request_error_code(R"({"id":1,"op":"write_file","path":"/f","data_b64":"!!"})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"write_file","path":"/f","data":"","mode":"0999"})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"write_file","path":"/f","data":"","mode":"100644"})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"write_file","path":"/f","data":"","mode":420})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"read_file"})") == "missing_field");
}

TEST_CASE("resume requests carry the host time and 16-512 bytes of entropy")
{
    const Request r = parse_request(
        R"({"id":"r","op":"resume","time_ns":1764412345123456789,"entropy_b64":"AAECAwQFBgcICQoLDA0ODw=="})");
    const auto& resume = std::get<ResumeRequest>(r.op);
    CHECK(resume.time_ns == 1764412345123456789u);
    CHECK(resume.entropy.size() == 16);
    CHECK(resume.entropy[15] == '\x0f');
    CHECK_FALSE(resume.pids_max);
    const Request limited = parse_request(
        R"({"id":"r","op":"resume","time_ns":1,"entropy":"0123456789abcdef","pids_max":64})");
    CHECK(std::get<ResumeRequest>(limited.op).pids_max == 64u);
    for (const char* bad : {"0", "4194305", "-1", "1.5", "\"64\"", "null"})
        CHECK(request_error_code(std::string(R"({"id":1,"op":"resume","time_ns":1,"entropy":"0123456789abcdef","pids_max":)")
                            + bad + "}") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"resume","entropy":"0123456789abcdef"})") == "missing_field");
    CHECK(request_error_code(R"({"id":1,"op":"resume","time_ns":1})") == "missing_field");
    CHECK(request_error_code(R"({"id":1,"op":"resume","time_ns":-1,"entropy":"0123456789abcdef"})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"resume","time_ns":1.5,"entropy":"0123456789abcdef"})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"resume","time_ns":1,"entropy":"short"})") == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"resume","time_ns":1,"entropy":")" + std::string(513, 'x') + "\"}")
          == "bad_field");
}

TEST_CASE("snapshot requests name a directory entry: letters, digits, '.', '_', '-', not starting with '.'")
{
    CHECK(std::get<SnapshotRequest>(parse_request(R"({"id":1,"op":"snapshot","name":"fork-1.a_b"})").op).name
          == "fork-1.a_b");
    CHECK(std::get<SnapshotRequest>(
              parse_request(R"({"id":1,"op":"snapshot","name":")" + std::string(max_snapshot_name_bytes, 'x') + "\"}").op)
              .name.size()
          == max_snapshot_name_bytes);
    for (const char* bad : {R"("")", R"(".hidden")", R"("..")", R"("a/b")", R"("a b")", R"("\u00e9")", "7", "null"})
        CHECK_MESSAGE(request_error_code(std::string(R"({"id":1,"op":"snapshot","name":)") + bad + "}") == "bad_field", bad);
    CHECK(request_error_code(R"({"id":1,"op":"snapshot","name":")" + std::string(max_snapshot_name_bytes + 1, 'x') + "\"}")
          == "bad_field");
    CHECK(request_error_code(R"({"id":1,"op":"snapshot"})") == "missing_field");
}

TEST_CASE("errors carry the request id once one could be read")
{
    CHECK(id_of_error("garbage").is_null());
    CHECK(id_of_error(R"({"op":"close"})").is_null());
    CHECK(id_of_error(R"({"id":42,"op":"nope"})") == 42);
    CHECK(id_of_error(R"({"id":"x","op":"exec"})") == "x");
    const Json response = Json::parse(to_line(error_response(7, "not_found", "no such file")));
    CHECK(response["id"] == 7);
    CHECK(response["error"]["code"] == "not_found");
    CHECK(response["error"]["message"] == "no such file");
}

TEST_CASE("modes are 1-4 octal digits and print as four")
{
    CHECK(parse_mode("0644") == 0644);
    CHECK(parse_mode("755") == 0755);
    CHECK(parse_mode("4755") == 04755);
    CHECK_THROWS_AS(parse_mode(""), CallError);
    CHECK_THROWS_AS(parse_mode("8"), CallError);
    CHECK_THROWS_AS(parse_mode("-644"), CallError);
    CHECK(format_mode(0100644) == "0644");
    CHECK(format_mode(07) == "0007");
}

TEST_CASE("to_line is one line even for text with newlines and invalid UTF-8 in messages")
{
    const std::string line = to_line(error_response(nullptr, "io", "two\nlines \xff"));
    CHECK(line.back() == '\n');
    CHECK(line.find('\n') == line.size() - 1);
    CHECK(Json::parse(line)["error"]["message"] == "two\nlines \xef\xbf\xbd");
}

TEST_CASE("to_line writes exactly what nlohmann's dump writes")
{
    std::string every_ascii;
    for (int c = 0; c < 0x80; ++c)
        every_ascii.push_back(static_cast<char>(c));
    const Json cases[] = {
        Json::object(),
        Json::array(),
        Json{{"id", 7}, {"stdout", every_ascii}, {"stderr", std::string(1000, '\0')}},
        Json{{"id", "x \"y\" \\ z"}, {"exit_code", nullptr}, {"timed_out", true}, {"ok", false}},
        Json{{"numbers", {0, -1, 18446744073709551615ull, -9223372036854775807ll, 1.5, 1e300, -0.25, 3.0}}},
        Json{{"nested", {{"a", Json::array({1, "two", Json::object(), Json::array()})}, {"b", {{"c", nullptr}}}}}},
        Json{{"utf8 \xc3\xa9 key \x7f", "\xe2\x82\xac \xf0\x9f\x98\x80 \xed\x9f\xbf \x7f"}},
        Json{{"invalid", "a\xff\xfe b \xc0\xaf \xed\xa0\x80 \x01"}},
        Json("a bare string\n"),
        Json(42),
    };
    for (const Json& message : cases)
        CHECK(to_line(message) == message.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n");
}

TEST_CASE("write_line hands over the same line in bounded pieces, and stops when told")
{
    const Json big{{"id", 3}, {"stdout", std::string(1 << 20, '\0')}, {"stderr", "a \"b\"\n"}, {"n", 5}};
    constexpr size_t piece = 64 << 10;
    std::string whole;
    size_t pieces = 0;
    size_t largest = 0;
    CHECK(write_line(big, piece, [&](std::string_view p) {
        whole += p;
        ++pieces;
        largest = std::max(largest, p.size());
        return true;
    }));
    CHECK(whole == to_line(big));
    CHECK(pieces >= (6u << 20) / (2 * piece));  // 6 MiB escaped
    CHECK(largest < 2 * piece);

    size_t calls = 0;
    CHECK_FALSE(write_line(big, piece, [&](std::string_view) { return ++calls < 3; }));
    CHECK(calls == 3);
}

TEST_CASE("line framing splits on newlines however the bytes arrive")
{
    FramerLog log(100);
    log.framer.feed("{\"a\":1}\n{\"b\"");
    log.framer.feed(":2}\n\n");
    log.framer.feed("x");
    log.framer.feed("y\nlast");
    log.framer.finish();
    CHECK(log.lines == std::vector<std::string>{"{\"a\":1}", "{\"b\":2}", "", "xy", "last"});
    CHECK(log.too_long == 0);
}

TEST_CASE("an over-long line is reported once, skipped, and the next line still arrives")
{
    FramerLog log(8);
    log.framer.feed("12345678\n");          // exactly the cap: fine
    log.framer.feed("123456789");           // one past it
    log.framer.feed(std::string(1000, 'x')); // more of the same line
    CHECK(log.too_long == 1);
    log.framer.feed("yyy\nok\n");
    log.framer.feed(std::string(20, 'z') + "\nagain\n");
    CHECK(log.lines == std::vector<std::string>{"12345678", "ok", "again"});
    CHECK(log.too_long == 2);
    // An over-long tail at end of stream is not delivered as a line.
    log.framer.feed(std::string(9, 'q'));
    log.framer.finish();
    CHECK(log.lines.size() == 3);
    CHECK(log.too_long == 3);
}

TEST_CASE("listen addresses")
{
    ListenAddress vsock = parse_listen_address("vsock:52");
    CHECK(vsock.kind == ListenAddress::Kind::vsock);
    CHECK(vsock.port == 52);
    ListenAddress unix_socket = parse_listen_address("unix:/tmp/agent.sock");
    CHECK(unix_socket.kind == ListenAddress::Kind::unix_socket);
    CHECK(unix_socket.path == "/tmp/agent.sock");
    for (const char* bad : {"", "vsock:", "vsock:0", "vsock:x", "vsock:52x", "vsock:-1", "vsock:4294967295",
             "vsock:99999999999", "unix:", "tcp:1", "52"})
        CHECK_THROWS_AS_MESSAGE(parse_listen_address(bad), Error, bad);
    CHECK_THROWS_AS(parse_listen_address("unix:" + std::string(200, 'p')), Error);
}
