// Connect's wire as service/e2b/connect_wire.hpp reads and writes it: envelopes (a request's
// one envelope and the ways a hostile body breaks it), the end-of-stream message, content
// types, Connect-Timeout-Ms, and proto3 JSON field reading (both key spellings, int64 as a
// number or a string, bytes in either base64 alphabet, enums by name or number).
#include <doctest/doctest.h>

#include <string>

#include "service/e2b/connect_wire.hpp"

using namespace agentvm;

namespace {

std::string envelope_of(std::string_view message, uint8_t flags = 0)
{
    return connect_envelope(message, flags);
}

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

TEST_CASE("an envelope is a flags byte, a big-endian length and the message")
{
    const std::string envelope = connect_envelope(std::string(300, 'x'), envelope_end_stream);
    REQUIRE(envelope.size() == 305);
    CHECK(static_cast<uint8_t>(envelope[0]) == 0x02);
    CHECK(static_cast<uint8_t>(envelope[1]) == 0);
    CHECK(static_cast<uint8_t>(envelope[2]) == 0);
    CHECK(static_cast<uint8_t>(envelope[3]) == 0x01);
    CHECK(static_cast<uint8_t>(envelope[4]) == 0x2c);
    CHECK(envelope.substr(5) == std::string(300, 'x'));
}

TEST_CASE("a request's one envelope gives its message")
{
    CHECK(single_envelope_message(envelope_of(R"({"path":"/tmp"})")) == R"({"path":"/tmp"})");
    CHECK(single_envelope_message(envelope_of("")).empty());
}

TEST_CASE("a broken request envelope is refused, each way with its reason")
{
    const std::string good = envelope_of(R"({"a":1})");
    SUBCASE("shorter than a header")
    {
        CHECK(failure_code([&] { single_envelope_message(good.substr(0, 4)); }) == "invalid_argument");
        CHECK(failure_code([&] { single_envelope_message(""); }) == "invalid_argument");
    }
    SUBCASE("truncated message")
    {
        CHECK(failure_code([&] { single_envelope_message(good.substr(0, good.size() - 1)); }) == "invalid_argument");
    }
    SUBCASE("a length that lies upwards")
    {
        std::string lying = good;
        lying[4] = static_cast<char>(lying[4] + 10);
        CHECK(failure_code([&] { single_envelope_message(lying); }) == "invalid_argument");
    }
    SUBCASE("two envelopes")
    {
        CHECK(failure_code([&] { single_envelope_message(good + good); }) == "invalid_argument");
    }
    SUBCASE("compressed")
    {
        CHECK(failure_code([&] { single_envelope_message(envelope_of("{}", envelope_compressed)); }) ==
              "invalid_argument");
    }
    SUBCASE("unknown flags, end-of-stream among them")
    {
        CHECK(failure_code([&] { single_envelope_message(envelope_of("{}", 0x80)); }) == "invalid_argument");
        CHECK(failure_code([&] { single_envelope_message(envelope_of("{}", envelope_end_stream)); }) ==
              "invalid_argument");
    }
    SUBCASE("over the limit, whatever follows")
    {
        CHECK(failure_code([&] { single_envelope_message(envelope_of(std::string(101, ' ')), 100); }) ==
              "resource_exhausted");
        std::string huge_claim = good;
        huge_claim[1] = static_cast<char>(0xff);
        CHECK(failure_code([&] { single_envelope_message(huge_claim); }) == "resource_exhausted");
        CHECK(single_envelope_message(envelope_of(std::string(100, ' ')), 100).size() == 100);
    }
}

TEST_CASE("the end of a stream says {} or the error")
{
    const std::string ok = connect_end_stream(std::nullopt);
    CHECK(static_cast<uint8_t>(ok[0]) == envelope_end_stream);
    CHECK(ok.substr(5) == "{}");
    const std::string failed = connect_end_stream(ConnectError{"not_found", "no process 7"});
    CHECK(Json::parse(failed.substr(5)) == Json::parse(R"({"error":{"code":"not_found","message":"no process 7"}})"));
}

TEST_CASE("content types: the JSON codec, unary or streamed, any case, with parameters")
{
    CHECK(is_unary_json("application/json"));
    CHECK(is_unary_json("Application/JSON; charset=utf-8"));
    CHECK_FALSE(is_unary_json("application/proto"));
    CHECK_FALSE(is_unary_json("application/connect+json"));
    CHECK_FALSE(is_unary_json(""));
    CHECK(is_stream_json("application/connect+json"));
    CHECK(is_stream_json("application/connect+json;charset=utf-8"));
    CHECK_FALSE(is_stream_json("application/connect+proto"));
    CHECK_FALSE(is_stream_json("application/json"));
}

TEST_CASE("Connect-Timeout-Ms: 1 to 10 digits")
{
    CHECK_FALSE(connect_timeout(std::nullopt));
    CHECK(connect_timeout(std::string("60000")) == std::chrono::milliseconds(60000));
    CHECK(connect_timeout(std::string("9999999999")) == std::chrono::milliseconds(9999999999));
    for (const char* bad : {"", "-1", "1.5", "12345678901", "10s", " 5"})
        CHECK(failure_code([&] { connect_timeout(std::string(bad)); }) == "invalid_argument");
}

TEST_CASE("a message is a JSON object; an empty body the empty message")
{
    CHECK(parse_connect_message("") == Json::object());
    CHECK(parse_connect_message(R"({"a":1})")["a"] == 1);
    for (const char* bad : {"[]", "1", "\"x\"", "{", "{\"a\":1}x", "null"})
        CHECK(failure_code([&] { parse_connect_message(bad); }) == "invalid_argument");
    CHECK(failure_code([&] { parse_connect_message(std::string(100, '[') + std::string(100, ']')); }) ==
          "invalid_argument");
}

TEST_CASE("fields read under either spelling, never both")
{
    const Json message = Json::parse(R"({"symlinkTarget":"a","max_entries":"7","both_ways":1,"bothWays":2})");
    const MessageReader reader(message);
    CHECK(reader.string("symlinkTarget", "symlink_target") == "a");
    CHECK(reader.int64("maxEntries", "max_entries") == 7);
    CHECK(failure_code([&] { reader.int64("bothWays", "both_ways"); }) == "invalid_argument");
    CHECK_FALSE(reader.has("absent", "absent"));
    CHECK(reader.string("absent", "absent").empty());
}

TEST_CASE("null reads as the default")
{
    const Json message = Json::parse(R"({"cwd":null,"stdin":null,"pid":null,"args":null})");
    const MessageReader reader(message);
    CHECK_FALSE(reader.has("cwd", "cwd"));
    CHECK(reader.string("cwd", "cwd").empty());
    CHECK_FALSE(reader.boolean("stdin", "stdin"));
    CHECK(reader.uint32("pid", "pid") == 0);
    CHECK(reader.strings("args", "args").empty());
}

TEST_CASE("int64 as a number or a decimal string, in range")
{
    const Json message = Json::parse(R"({"a":"-9223372036854775808","b":9223372036854775807,"c":"12",
        "d":"1e3","e":1.5,"f":"9223372036854775808","g":"","h":"-","i":true,"j":"-12"})");
    const MessageReader reader(message);
    CHECK(reader.int64("a", "a") == INT64_MIN);
    CHECK(reader.int64("b", "b") == INT64_MAX);
    CHECK(reader.int64("c", "c") == 12);
    CHECK(reader.int64("j", "j") == -12);
    for (const char* bad : {"d", "e", "f", "g", "h", "i"})
        CHECK_MESSAGE(failure_code([&] { reader.int64(bad, bad); }) == "invalid_argument", bad);
}

TEST_CASE("uint32 refuses what it cannot hold")
{
    const Json message = Json::parse(R"({"ok":"4294967295","big":4294967296,"neg":-1,"negs":"-1"})");
    const MessageReader reader(message);
    CHECK(reader.uint32("ok", "ok") == 4294967295u);
    for (const char* bad : {"big", "neg", "negs"})
        CHECK(failure_code([&] { reader.uint32(bad, bad); }) == "invalid_argument");
}

TEST_CASE("bytes: standard or URL-safe base64, padded or not")
{
    const Json message = Json::parse(R"({"std":"/w==","url":"_w","plain":"aGk=","bare":"aGk","bad":"a","junk":"a*b=",
        "num":5})");
    const MessageReader reader(message);
    CHECK(reader.bytes("std", "std") == std::string("\xff"));
    CHECK(reader.bytes("url", "url") == std::string("\xff"));
    CHECK(reader.bytes("plain", "plain") == "hi");
    CHECK(reader.bytes("bare", "bare") == "hi");
    for (const char* bad : {"bad", "junk", "num"})
        CHECK(failure_code([&] { reader.bytes(bad, bad); }) == "invalid_argument");
    CHECK(proto_bytes("\xff") == "/w==");
}

TEST_CASE("wrong types name the field by its path")
{
    const Json message = Json::parse(R"({"process":{"cmd":5,"args":["a",1],"envs":{"A":1}},"stdin":"yes"})");
    const MessageReader reader(message);
    const MessageReader process = reader.message("process", "process");
    try {
        (void)process.string("cmd", "cmd");
        FAIL("a number read as a string");
    } catch (const ConnectFailure& e) {
        CHECK(e.code() == "invalid_argument");
        CHECK(std::string(e.what()).find("process.cmd") != std::string::npos);
    }
    CHECK(failure_code([&] { process.strings("args", "args"); }) == "invalid_argument");
    CHECK(failure_code([&] { process.string_map("envs", "envs"); }) == "invalid_argument");
    CHECK(failure_code([&] { reader.boolean("stdin", "stdin"); }) == "invalid_argument");
    CHECK(failure_code([&] { reader.message("stdin", "stdin"); }) == "invalid_argument");
}

TEST_CASE("enums by name or number")
{
    constexpr std::array<std::pair<std::string_view, int>, 3> values{
        {{"SIGNAL_UNSPECIFIED", 0}, {"SIGNAL_SIGTERM", 15}, {"SIGNAL_SIGKILL", 9}}};
    const Json message = Json::parse(R"({"a":"SIGNAL_SIGKILL","b":15,"c":"SIGKILL","d":3,"e":"15"})");
    const MessageReader reader(message);
    CHECK(reader.enum_value("a", "a", values) == 9);
    CHECK(reader.enum_value("b", "b", values) == 15);
    CHECK(reader.enum_value("none", "none", values) == 0);
    for (const char* bad : {"c", "d", "e"})
        CHECK(failure_code([&] { reader.enum_value(bad, bad, values); }) == "invalid_argument");
}
