// What serve sends to and reads from a server inside a guest (service/ports/): the request
// head it writes, the answer it reads from a hostile guest, the port numbers it takes, and the
// E2B host names that name a sandbox's port.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "service/e2b/sandbox_route.hpp"
#include "service/ports/guest_http_response.hpp"
#include "service/ports/guest_ports.hpp"
#include "service/ports/guest_request_head.hpp"
#include "service/problem.hpp"

using namespace agentvm;

namespace {

struct Read {
    GuestHttpResponse::Head head;
    bool head_seen = false;
    std::string body;
    bool ended = false;
    std::optional<std::string> error;
};

// Feeds `answer` in pieces of `piece` bytes, then the connection's end if `close`.
Read read_answer(const std::string& answer, size_t piece = 7, bool close = true, bool head_request = false)
{
    Read read;
    GuestHttpResponse response(head_request, {[&](const GuestHttpResponse::Head& head) {
                                                  read.head = head;
                                                  read.head_seen = true;
                                              },
                                              [&](std::string_view bytes) { read.body.append(bytes); },
                                              [&] { read.ended = true; }});
    for (size_t at = 0; at < answer.size() && !read.error && !read.ended; at += piece)
        read.error = response.feed(std::string_view(answer).substr(at, piece));
    if (close && !read.error && !read.ended)
        read.error = response.feed({});
    return read;
}

std::string header_of(const GuestHttpResponse::Head& head, const std::string& name)
{
    for (const auto& [n, v] : head.headers)
        if (n == name)
            return v;
    return "(none)";
}

} // namespace

TEST_CASE("the guest's answer: framed by length, chunked, or the connection's end")
{
    const Read length = read_answer("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-A: 1\r\nConnection: keep-alive\r\n"
                                    "Date: x\r\nContent-Length: 5\r\n\r\nhello");
    CHECK(!length.error);
    CHECK(length.ended);
    CHECK(length.head.status == 200);
    CHECK(length.head.content_type == "text/plain");
    CHECK(length.head.content_length == 5);
    CHECK(header_of(length.head, "X-A") == "1");
    CHECK(header_of(length.head, "Connection") == "(none)");
    CHECK(header_of(length.head, "Date") == "(none)");
    CHECK(header_of(length.head, "Content-Length") == "(none)");
    CHECK(length.body == "hello");

    const Read chunked =
        read_answer("HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", 3);
    CHECK(!chunked.error);
    CHECK(chunked.ended);
    CHECK(!chunked.head.content_length);
    CHECK(chunked.body == "abcde");

    const Read until_close = read_answer("HTTP/1.1 200 OK\r\n\r\nall of it", 4);
    CHECK(!until_close.error);
    CHECK(until_close.ended);
    CHECK(until_close.body == "all of it");
}

TEST_CASE("the guest's answer: HEAD, interim answers, and a protocol switch with its first bytes")
{
    const Read head = read_answer("HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n", 5, false, true);
    CHECK(!head.error);
    CHECK(head.ended);
    CHECK(head.head.content_length == 99);
    CHECK(head.body.empty());

    const Read interim = read_answer("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", 6, false);
    CHECK(!interim.error);
    CHECK(interim.ended);
    CHECK(interim.head.status == 204);

    std::string rest;
    GuestHttpResponse response(false, {[](const GuestHttpResponse::Head& h) { CHECK(h.upgrade); }, [](std::string_view) {},
                                       [] {}});
    CHECK(!response.feed("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n\x81\x02hi"));
    CHECK(response.take_upgraded() == "\x81\x02hi");
}

TEST_CASE("a hostile guest's answer fails cleanly: garbage, early end, oversized or poisoned heads")
{
    CHECK(read_answer("SSH-2.0-OpenSSH\r\n").error);
    // Found by fuzz_guest_http: http-parser takes a status of two digits.
    CHECK(read_answer("HTTP/1.1 11 X\r\n\r\n").error);
    CHECK(read_answer("HTTP/1.1 600 X\r\n\r\n").error);
    // Found by fuzz_guest_http: an interim answer saying it has a body; its bytes never reach the client.
    const Read interim_body = read_answer("HTTP/1.1 100 Continue\r\nContent-Length: 3\r\n\r\nxyzHTTP/1.1 200 OK\r\n"
                                          "Content-Length: 2\r\n\r\nok");
    CHECK(interim_body.body.find("xyz") == std::string::npos);
    const Read silent = read_answer("");
    REQUIRE(silent.error);
    CHECK(silent.error->find("without answering") != std::string::npos);
    const Read short_body = read_answer("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc");
    REQUIRE(short_body.error);
    CHECK(short_body.error->find("before its answer ended") != std::string::npos);
    CHECK(short_body.head_seen);

    std::string huge = "HTTP/1.1 200 OK\r\n";
    while (huge.size() < GuestHttpResponse::max_head_bytes + 1024)
        huge += "X-Filler: " + std::string(100, 'a') + "\r\n";
    const Read oversized = read_answer(huge + "\r\n", 4096);
    REQUIRE(oversized.error);
    CHECK(!oversized.head_seen);

    std::string many = "HTTP/1.1 200 OK\r\n";
    for (size_t i = 0; i <= GuestHttpResponse::max_fields; ++i)
        many += "X-" + std::to_string(i) + ": v\r\n";
    CHECK(read_answer(many + "\r\n", 4096).error);

    // A value with a control character in it would split the client's header on its way out.
    const Read poisoned = read_answer(std::string("HTTP/1.1 200 OK\r\nX-A: a\x01") + "b\r\n\r\n");
    CHECK(poisoned.error);
    CHECK(!poisoned.head_seen);
    // Bytes after a whole answer were not asked for: ignored, not a second answer.
    const Read extra = read_answer("HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\naHTTP/1.1 500 X\r\n\r\n", 100);
    CHECK(!extra.error);
    CHECK(extra.head.status == 200);
    CHECK(extra.body == "a");
}

TEST_CASE("the request head for the guest drops the hop's fields and serve's credentials and frames the body anew")
{
    const HeaderList headers{{"Host", "example"},          {"Authorization", "Bearer t"}, {"Connection", "keep-alive"},
                             {"Keep-Alive", "5"},          {"Content-Length", "12"},      {"Expect", "100-continue"},
                             {"X-Trace", "abc"},           {"Proxy-Authorization", "p"}};
    const GuestRequestHead plain = guest_request_head("POST", "/a%20b?q=1", headers, {"Authorization"});
    CHECK(plain.framing == BodyFraming::length);
    CHECK(!plain.upgrade);
    CHECK(plain.text
          == "POST /a%20b?q=1 HTTP/1.1\r\nHost: example\r\nX-Trace: abc\r\nContent-Length: 12\r\nConnection: close\r\n\r\n");

    const GuestRequestHead chunked =
        guest_request_head("PUT", "/", {{"Transfer-Encoding", "chunked"}, {"E2b-Sandbox-Id", "x"}}, {"e2b-sandbox-id"});
    CHECK(chunked.framing == BodyFraming::chunked);
    CHECK(chunked.text == "PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n");

    const GuestRequestHead websocket = guest_request_head(
        "GET", "/ws", {{"Connection", "keep-alive, Upgrade"}, {"Upgrade", "websocket"}, {"Sec-WebSocket-Key", "k"}}, {});
    CHECK(websocket.upgrade);
    CHECK(websocket.framing == BodyFraming::none);
    CHECK(websocket.text == "GET /ws HTTP/1.1\r\nSec-WebSocket-Key: k\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n");
    // An Upgrade header the client's Connection does not name is not a request to switch.
    CHECK(!guest_request_head("GET", "/", {{"Upgrade", "websocket"}}, {}).upgrade);
}

TEST_CASE("guest port numbers: 1 to 65535, not serve's own E2B ports")
{
    CHECK(GuestPorts::port_number("1") == 1);
    CHECK(GuestPorts::port_number("8080") == 8080);
    CHECK(GuestPorts::port_number("65535") == 65535);
    for (const char* bad : {"", "0", "65536", "08", "-1", "+80", "80a", "99999999999", " 80", "49983", "49999"}) {
        INFO(bad);
        CHECK_THROWS_AS(GuestPorts::port_number(bad), RefusedRequest);
    }
}

TEST_CASE("E2B host names: <port>-<sandbox id>.<domain>")
{
    const auto routed = sandbox_host("8080-node1-4e7a10-3f9c2a7d1e0b4c65.sb.example.com:3000", "sb.example.com");
    REQUIRE(routed);
    CHECK(routed->first == "8080");
    CHECK(routed->second == "node1-4e7a10-3f9c2a7d1e0b4c65");
    CHECK(sandbox_host("8080-ID.SB.Example.COM", "sb.example.com"));
    CHECK(!sandbox_host("sb.example.com", "sb.example.com"));
    CHECK(!sandbox_host("8080-id.other.com", "sb.example.com"));
    CHECK(!sandbox_host("8080-id.xsb.example.com.evil", "sb.example.com"));
    CHECK(!sandbox_host("web-id.sb.example.com", "sb.example.com"));
    CHECK(!sandbox_host("-id.sb.example.com", "sb.example.com"));
    CHECK(!sandbox_host("8080.a.sb.example.com", "sb.example.com"));
    CHECK(!sandbox_host("8080-a.b.sb.example.com", "sb.example.com"));
}
