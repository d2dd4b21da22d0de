// The client's half of serve's TCP upgrade (cli/port_forward/upgrade_head.hpp) and the
// handshake that reads its answer (serve_handshake.hpp): the request's bytes, a 101 with
// stream bytes after its head, serve's JSON errors, heads too large, and what is not HTTP.
#include <doctest/doctest.h>

#include <string>

#include "cli/port_forward/serve_handshake.hpp"
#include "cli/port_forward/upgrade_head.hpp"

using namespace agentvm;

namespace {

using Kind = HandshakeStep::Kind;

// Feeds `answer` to a fresh handshake `chunk` bytes at a time; the last step, and what is
// left in its buffer.
HandshakeStep feed(const std::string& answer, size_t chunk, std::string* left = nullptr, bool eof_at_end = false)
{
    ServeUpgradeHandshake handshake("GET / HTTP/1.1\r\n\r\n");
    std::string received;
    HandshakeStep step;
    for (size_t at = 0; at < answer.size(); at += chunk) {
        received += answer.substr(at, chunk);
        step = handshake.advance(received, false);
        if (step.kind != Kind::need_more)
            break;
    }
    if (step.kind == Kind::need_more && eof_at_end)
        step = handshake.advance(received, true);
    if (left)
        *left = received;
    return step;
}

const std::string switching = "HTTP/1.1 101 Switching Protocols\r\n"
                              "Upgrade: agentvm-tcp\r\n"
                              "Connection: Upgrade\r\n"
                              "\r\n";

} // namespace

TEST_CASE("the upgrade request: path, Host, Connection, Upgrade and the token when there is one")
{
    CHECK(upgrade_request_text({"127.0.0.1:8080", "", "node1-4e7a10-3f9c2a7d1e0b4c65", 8000, "s3cret"}) ==
          "GET /v1/sandboxes/node1-4e7a10-3f9c2a7d1e0b4c65/tcp/8000 HTTP/1.1\r\n"
          "Host: 127.0.0.1:8080\r\n"
          "Connection: Upgrade\r\n"
          "Upgrade: agentvm-tcp\r\n"
          "Authorization: Bearer s3cret\r\n"
          "\r\n");
    CHECK(upgrade_request_text({"localhost", "/agentvm", "sb", 22, ""}) ==
          "GET /agentvm/v1/sandboxes/sb/tcp/22 HTTP/1.1\r\n"
          "Host: localhost\r\n"
          "Connection: Upgrade\r\n"
          "Upgrade: agentvm-tcp\r\n"
          "\r\n");
}

TEST_CASE("a sandbox id must be one path segment")
{
    CHECK(sandbox_id_problem("node1-4e7a10-3f9c2a7d1e0b4c65").empty());
    CHECK(sandbox_id_problem("a.b_c~d").empty());
    for (const char* id : {"", ".", "..", "a/b", "a b", "a?b", "a#b", "a%2Fb", "a\r\nX-Evil: 1"})
        CHECK_MESSAGE(!sandbox_id_problem(id).empty(), id);
    CHECK(sandbox_id_problem(std::string(257, 'a')).find("256") != std::string::npos);
}

TEST_CASE("a 101 head, and the stream bytes that came after it are kept")
{
    const std::string stream = "SSH-2.0-OpenSSH_9.2\r\n\x00\x01\xff binary";
    const UpgradeHead head = parse_upgrade_head(switching + stream);
    REQUIRE(head.parse == UpgradeHead::Parse::complete);
    CHECK(head.status == 101);
    CHECK(head.reason == "Switching Protocols");
    CHECK(head.length == switching.size());
    CHECK(head.header("upgrade") == "agentvm-tcp");
    CHECK(head.header("CONNECTION") == "Upgrade");
    CHECK(!head.header("Content-Length"));
    CHECK(head.upgraded());

    for (const size_t chunk : {size_t(1), size_t(7), size_t(4096)}) {
        std::string left;
        const HandshakeStep step = feed(switching + stream, chunk, &left);
        CHECK(step.kind == Kind::done);
        // Byte by byte the handshake is done as the blank line ends; in bigger pieces the
        // stream's first bytes are left over, unchanged.
        CHECK(stream.starts_with(left));
        if (chunk == 4096)
            CHECK(left == stream);
    }
}

TEST_CASE("a head arriving byte by byte is incomplete until its blank line")
{
    for (size_t n = 0; n < switching.size(); ++n)
        CHECK_MESSAGE(parse_upgrade_head(switching.substr(0, n)).parse == UpgradeHead::Parse::incomplete, n);
    CHECK(parse_upgrade_head(switching).parse == UpgradeHead::Parse::complete);
}

TEST_CASE("bare LF line ends, header values trimmed, the Upgrade token without case")
{
    const UpgradeHead head = parse_upgrade_head("HTTP/1.1 101 Switching Protocols\nupgrade:   AgentVM-TCP \n\nrest");
    REQUIRE(head.parse == UpgradeHead::Parse::complete);
    CHECK(head.header("Upgrade") == "AgentVM-TCP");
    CHECK(head.upgraded());
    CHECK(head.length == std::string("HTTP/1.1 101 Switching Protocols\nupgrade:   AgentVM-TCP \n\n").size());
}

TEST_CASE("a 101 without Upgrade: agentvm-tcp is refused")
{
    for (const std::string& answer :
         {std::string("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n\r\n"),
          std::string("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n")}) {
        const HandshakeStep step = feed(answer, 4096);
        CHECK(step.kind == Kind::refused);
        CHECK(step.text == "serve answered 101 Switching Protocols without 'Upgrade: agentvm-tcp'");
    }
}

TEST_CASE("404 and 502 with serve's JSON error: the code and message are reported")
{
    const std::string body = R"J({"error":"not_found","message":"no sandbox 'sb-9' (deleted)"})J";
    const std::string answer = "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: " +
                               std::to_string(body.size()) + "\r\n\r\n" + body;
    for (const size_t chunk : {size_t(1), size_t(10), size_t(4096)}) {
        const HandshakeStep step = feed(answer, chunk);
        CHECK(step.kind == Kind::refused);
        CHECK(step.text == "serve answered 404 Not Found: not_found: no sandbox 'sb-9' (deleted)");
    }
    // The nested shape, {"error":{"code":...,"message":...}}, reads the same.
    const std::string nested = R"({"error":{"code":"vm_died","message":"the VM died: exit 4"}})";
    const HandshakeStep step = feed("HTTP/1.1 502 Bad Gateway\r\nContent-Length: " + std::to_string(nested.size()) +
                                        "\r\n\r\n" + nested,
                                    4096);
    CHECK(step.kind == Kind::refused);
    CHECK(step.text == "serve answered 502 Bad Gateway: vm_died: the VM died: exit 4");
}

TEST_CASE("an error body that is not serve's JSON is shown clipped and escaped")
{
    HandshakeStep step = feed("HTTP/1.1 400 Bad Request\r\nContent-Length: 18\r\n\r\n<html>\x1b[31m</html>", 4096);
    CHECK(step.kind == Kind::refused);
    CHECK(step.text == "serve answered 400 Bad Request: <html>\\x1b[31m</html>");
    // No Content-Length: the body lasts until serve closes.
    step = feed("HTTP/1.1 403 Forbidden\r\n\r\nnot for you\n", 4096, nullptr, true);
    CHECK(step.kind == Kind::refused);
    CHECK(step.text == "serve answered 403 Forbidden: not for you");
    // A chunked body is not decoded: the status alone.
    step = feed("HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", 4096);
    CHECK(step.kind == Kind::refused);
    CHECK(step.text == "serve answered 500 Internal Server Error");
    // A body longer than the head's bound is cut there, not waited for.
    step = feed("HTTP/1.1 500 Oops\r\nContent-Length: 100000\r\n\r\n" + std::string(max_upgrade_head, 'x'), 65536);
    CHECK(step.kind == Kind::refused);
    CHECK(step.text.starts_with("serve answered 500 Oops: xxxx"));
    CHECK(step.text.ends_with("..."));
}

TEST_CASE("a head over 16 KiB is refused, not buffered on")
{
    std::string huge = "HTTP/1.1 101 Switching Protocols\r\n";
    while (huge.size() < max_upgrade_head + 100)
        huge += "X-Padding: " + std::string(100, 'p') + "\r\n";
    const UpgradeHead head = parse_upgrade_head(huge);
    CHECK(head.parse == UpgradeHead::Parse::too_large);
    CHECK(head.problem == "the answer's head is longer than 16384 bytes");
    // Its blank line past the bound changes nothing.
    CHECK(parse_upgrade_head(huge + "\r\n").parse == UpgradeHead::Parse::too_large);
    // One line of 16 KiB without a newline.
    CHECK(parse_upgrade_head("HTTP/1.1 200 " + std::string(max_upgrade_head, 'a')).parse ==
          UpgradeHead::Parse::too_large);
    const HandshakeStep step = feed(huge, 1000);
    CHECK(step.kind == Kind::refused);
    CHECK(step.text == "serve's answer: the answer's head is longer than 16384 bytes");
}

TEST_CASE("what is not an HTTP/1.x answer is refused as soon as it shows")
{
    UpgradeHead head = parse_upgrade_head("SSH-2");
    CHECK(head.parse == UpgradeHead::Parse::malformed);
    CHECK(head.problem == "not an HTTP/1.x answer: 'SSH-2'");
    CHECK(parse_upgrade_head("HTTP/2 200\r\n\r\n").parse == UpgradeHead::Parse::malformed);
    CHECK(parse_upgrade_head("\x16\x03\x01").parse == UpgradeHead::Parse::malformed);  // a TLS record
    CHECK(parse_upgrade_head("HTT").parse == UpgradeHead::Parse::incomplete);
    for (const char* answer : {"HTTP/1.1 1O1 Switching\r\n\r\n", "HTTP/1.1 101Switching\r\n\r\n", "HTTP/1.1\r\n\r\n",
                               "HTTP/1.1 101 OK\r\nno colon here\r\n\r\n", "HTTP/1.1 101 OK\r\n: empty name\r\n\r\n",
                               "HTTP/1.1 101 OK\r\nBad Name: x\r\n\r\n",
                               "HTTP/1.1 101 OK\r\nUpgrade: agentvm-tcp\r\n folded\r\n\r\n"}) {
        head = parse_upgrade_head(answer);
        CHECK_MESSAGE(head.parse == UpgradeHead::Parse::malformed, answer);
        CHECK_MESSAGE(!head.problem.empty(), answer);
    }
    const HandshakeStep step = feed("220 smtp.example ESMTP\r\n", 4096);
    CHECK(step.kind == Kind::refused);
    CHECK(step.text == "serve's answer: not an HTTP/1.x answer: '220 smtp.example ESMTP\\x0d\\x0a'");
}

TEST_CASE("serve closing before or during its answer")
{
    ServeUpgradeHandshake handshake("GET / HTTP/1.1\r\n\r\n");
    std::string received;
    HandshakeStep step = handshake.advance(received, true);
    CHECK(step.kind == Kind::refused);
    CHECK(step.text == "serve closed the connection without answering");
    ServeUpgradeHandshake second("GET / HTTP/1.1\r\n\r\n");
    received = "HTTP/1.1 101 Switching";
    step = second.advance(received, true);
    CHECK(step.kind == Kind::refused);
    CHECK(step.text == "serve closed the connection in the middle of its answer");
    // A refusal whose body is cut short by the close is reported with what came.
    step = feed("HTTP/1.1 502 Bad Gateway\r\nContent-Length: 50\r\n\r\n{\"error\":\"vm_", 4096, nullptr, true);
    CHECK(step.kind == Kind::refused);
    CHECK(step.text == "serve answered 502 Bad Gateway: {\"error\":\"vm_");
}
