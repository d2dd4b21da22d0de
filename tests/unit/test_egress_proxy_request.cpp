// The host egress proxy's reading of a sandbox's request (service/egress/proxy_request.hpp)
// and its answers (proxy_answer.hpp): CONNECT and absolute-form requests, whole and cut into
// pieces, with the bytes after the head kept; the head rewritten for upstream; each refusal
// and its reason; the answers' exact bytes.
#include <doctest/doctest.h>

#include <string>
#include <variant>
#include <vector>

#include "service/egress/proxy_answer.hpp"
#include "service/egress/proxy_request.hpp"

using namespace agentvm;

namespace {

using Kind = ProxyRequest::Kind;

// Feeds `bytes` `piece` at a time (0: whole), then the connection's end if no reading came;
// checks that exactly one reading comes and nothing after it.
ProxyReading read_in_pieces(const std::string& bytes, size_t piece)
{
    ProxyRequestReader reader;
    std::optional<ProxyReading> reading;
    if (piece == 0)
        piece = bytes.size() + 1;
    for (size_t at = 0; at < bytes.size() && !reading; at += piece)
        reading = reader.feed(std::string_view(bytes).substr(at, piece));
    if (!reading)
        reading = reader.feed({});
    REQUIRE(reading);
    CHECK(reader.done());
    CHECK_FALSE(reader.feed("more"));
    CHECK_FALSE(reader.feed({}));
    return *reading;
}

constexpr size_t piece_sizes[] = {1, 2, 3, 7, 64};

// The request `bytes` make, fed whole; fed in pieces of every size it must be the same, its
// early bytes a prefix of the whole feed's.
ProxyRequest accepted(const std::string& bytes)
{
    const ProxyReading whole = read_in_pieces(bytes, 0);
    if (const auto* refusal = std::get_if<ProxyRefusal>(&whole))
        FAIL("refused: ", refusal->reason);
    const ProxyRequest request = std::get<ProxyRequest>(whole);
    for (size_t piece : piece_sizes) {
        CAPTURE(piece);
        const ProxyReading reading = read_in_pieces(bytes, piece);
        REQUIRE(std::holds_alternative<ProxyRequest>(reading));
        const auto& cut = std::get<ProxyRequest>(reading);
        CHECK(cut.kind == request.kind);
        CHECK(cut.method == request.method);
        CHECK(cut.destination.host == request.destination.host);
        CHECK(cut.destination.port == request.destination.port);
        CHECK(cut.destination.address == request.destination.address);
        CHECK(cut.upstream_head == request.upstream_head);
        CHECK(request.early.starts_with(cut.early));
        CHECK(cut.early.size() < piece);
    }
    return request;
}

// The reason `bytes` are refused for, the same however they are cut.
std::string refusal(const std::string& bytes, bool ended = false)
{
    const ProxyReading whole = read_in_pieces(bytes, 0);
    if (!std::holds_alternative<ProxyRefusal>(whole))
        FAIL("accepted: ", bytes);
    const ProxyRefusal refused = std::get<ProxyRefusal>(whole);
    CHECK(refused.ended == ended);
    for (size_t piece : piece_sizes) {
        CAPTURE(piece);
        const ProxyReading reading = read_in_pieces(bytes, piece);
        REQUIRE(std::holds_alternative<ProxyRefusal>(reading));
        CHECK(std::get<ProxyRefusal>(reading).reason == refused.reason);
        CHECK(std::get<ProxyRefusal>(reading).ended == ended);
    }
    return refused.reason;
}

bool contains(const std::string& text, const std::string& part)
{
    return text.find(part) != std::string::npos;
}

std::string get(const std::string& target, const std::string& fields = "")
{
    return "GET " + target + " HTTP/1.1\r\n" + fields + "\r\n";
}

} // namespace

TEST_CASE("CONNECT to a name, with what a tool sends along")
{
    const ProxyRequest request = accepted("CONNECT pypi.org:443 HTTP/1.1\r\n"
                                          "Host: pypi.org:443\r\n"
                                          "User-Agent: pip/24.0\r\n"
                                          "Proxy-Connection: keep-alive\r\n"
                                          "\r\n");
    CHECK(request.kind == Kind::tunnel);
    CHECK(request.method == "CONNECT");
    CHECK(request.destination.host == "pypi.org");
    CHECK(request.destination.port == 443);
    CHECK_FALSE(request.destination.address);
    CHECK(request.destination.where() == "pypi.org:443");
    CHECK(request.upstream_head.empty());
    CHECK(request.early.empty());
}

TEST_CASE("CONNECT keeps the tunnel's first bytes that came with the head, NULs and all")
{
    const std::string hello("\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00", 10);
    const ProxyRequest request = accepted("CONNECT files.pythonhosted.org:443 HTTP/1.1\r\n\r\n" + hello);
    CHECK(request.destination.host == "files.pythonhosted.org");
    CHECK(request.early == hello);
    // A Content-Length on a CONNECT does not make what follows a body: it is the tunnel's.
    CHECK(accepted("CONNECT a.example:443 HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcdef").early == "abcdef");
}

TEST_CASE("CONNECT to IP literals, a name in capitals with its trailing dot, and over HTTP/1.0")
{
    const ProxyRequest v4 = accepted("CONNECT 10.1.2.3:8443 HTTP/1.1\r\n\r\n");
    CHECK(v4.destination.host == "10.1.2.3");
    CHECK(v4.destination.port == 8443);
    REQUIRE(v4.destination.address);
    CHECK(v4.destination.address->is_v4());

    const ProxyRequest v6 = accepted("CONNECT [2001:DB8:0::1]:443 HTTP/1.1\r\n\r\n");
    CHECK(v6.destination.host == "2001:db8::1");
    REQUIRE(v6.destination.address);
    CHECK_FALSE(v6.destination.address->is_v4());
    CHECK(v6.destination.where() == "[2001:db8::1]:443");

    CHECK(accepted("CONNECT GitHub.COM.:22 HTTP/1.1\r\n\r\n").destination.host == "github.com");
    CHECK(accepted("CONNECT x_y.example:1 HTTP/1.0\r\n\r\n").destination.port == 1);
    CHECK(accepted("CONNECT example.com:65535 HTTP/1.1\r\n\r\n").destination.port == 65535);
}

TEST_CASE("absolute-form: origin-form upstream, hop-by-hop fields dropped, Connection: close")
{
    const ProxyRequest request = accepted("GET http://example.com/simple/pkg/?x=1&y=2 HTTP/1.1\r\n"
                                          "Host: example.com\r\n"
                                          "User-Agent: curl/7.88.1\r\n"
                                          "Accept: */*\r\n"
                                          "Proxy-Connection: Keep-Alive\r\n"
                                          "Proxy-Authorization: Basic dXNlcjpwYXNz\r\n"
                                          "Connection: keep-alive, X-Private\r\n"
                                          "X-Private: hop only\r\n"
                                          "Keep-Alive: timeout=5\r\n"
                                          "TE: trailers\r\n"
                                          "Upgrade: h2c\r\n"
                                          "X-Kept:  spaces around  \r\n"
                                          "\r\n");
    CHECK(request.kind == Kind::http);
    CHECK(request.method == "GET");
    CHECK(request.destination.host == "example.com");
    CHECK(request.destination.port == 80);
    CHECK(request.upstream_head == "GET /simple/pkg/?x=1&y=2 HTTP/1.1\r\n"
                                   "Host: example.com\r\n"
                                   "User-Agent: curl/7.88.1\r\n"
                                   "Accept: */*\r\n"
                                   "X-Kept: spaces around\r\n"
                                   "Connection: close\r\n"
                                   "\r\n");
    CHECK(request.early.empty());
}

TEST_CASE("absolute-form: Host from the URI, replacing the client's; path, query, port and fragment")
{
    CHECK(accepted(get("http://example.com")).upstream_head ==
          "GET / HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n");
    CHECK(accepted(get("http://example.com?q=1")).upstream_head ==
          "GET /?q=1 HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n");
    // RFC 9112 3.2.2: the proxy ignores the client's Host, so a name the policy did not judge
    // never reaches the server.
    const ProxyRequest fronted =
        accepted(get("http://allowed.example:8080/p#frag", "Host: internal.example\r\nHOST: b\r\n"));
    CHECK(fronted.destination.port == 8080);
    CHECK(fronted.upstream_head == "GET /p HTTP/1.1\r\nHost: allowed.example:8080\r\nConnection: close\r\n\r\n");
    const ProxyRequest upper = accepted(get("HTTP://EXAMPLE.Com:80/A"));
    CHECK(upper.destination.host == "example.com");
    CHECK(upper.upstream_head == "GET /A HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n");
    const ProxyRequest v6 = accepted(get("http://[::1]:8080/x"));
    CHECK(v6.destination.host == "::1");
    CHECK(v6.upstream_head == "GET /x HTTP/1.1\r\nHost: [::1]:8080\r\nConnection: close\r\n\r\n");
    const ProxyRequest v4 = accepted(get("http://192.0.2.7/"));
    CHECK(v4.destination.address == IpAddress::v4(192, 0, 2, 7));
}

TEST_CASE("absolute-form with a body: its framing passed on, its first bytes kept, Expect too")
{
    const ProxyRequest posted = accepted("POST http://example.com/upload HTTP/1.1\r\n"
                                         "Content-Length: 11\r\n"
                                         "Expect: 100-continue\r\n"
                                         "Content-Type: text/plain\r\n"
                                         "\r\n"
                                         "hello");
    CHECK(posted.method == "POST");
    CHECK(posted.upstream_head == "POST /upload HTTP/1.1\r\n"
                                  "Host: example.com\r\n"
                                  "Content-Length: 11\r\n"
                                  "Expect: 100-continue\r\n"
                                  "Content-Type: text/plain\r\n"
                                  "Connection: close\r\n"
                                  "\r\n");
    CHECK(posted.early == "hello");

    const ProxyRequest chunked = accepted("PUT http://example.com/x HTTP/1.1\r\n"
                                          "Transfer-Encoding: gzip, chunked\r\n"
                                          "\r\n"
                                          "5\r\nhello\r\n0\r\n\r\n");
    CHECK(chunked.upstream_head == "PUT /x HTTP/1.1\r\n"
                                   "Host: example.com\r\n"
                                   "Transfer-Encoding: gzip, chunked\r\n"
                                   "Connection: close\r\n"
                                   "\r\n");
    CHECK(chunked.early == "5\r\nhello\r\n0\r\n\r\n");

    // Whatever Connection names, the framing stays: the body is spliced as it comes.
    const std::string listed = "Connection: Content-Length, Transfer-Encoding\r\nContent-Length: 0\r\n";
    CHECK(accepted(get("http://example.com/", listed)).upstream_head ==
          "GET / HTTP/1.1\r\nHost: example.com\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
}

TEST_CASE("absolute-form: HTTP/1.0 keeps its version, bare LF and leading empty lines are taken")
{
    CHECK(accepted("GET http://example.com/ HTTP/1.0\r\nUser-Agent: old\r\n\r\n").upstream_head ==
          "GET / HTTP/1.0\r\nHost: example.com\r\nUser-Agent: old\r\nConnection: close\r\n\r\n");
    CHECK(accepted("GET http://example.com/ HTTP/1.1\nAccept: */*\n\nrest").upstream_head ==
          "GET / HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\nConnection: close\r\n\r\n");
    CHECK(accepted("\r\n\r\nHEAD http://example.com/ HTTP/1.1\r\n\r\n").method == "HEAD");
}

TEST_CASE("the bounds: 16 KiB of head and 100 fields are taken, a byte or a field more is not")
{
    const std::string start = "CONNECT example.com:443 HTTP/1.1\r\n";
    const std::string filler_name = "X-Filler: ";
    const size_t fill = ProxyRequestReader::max_head_bytes - start.size() - filler_name.size() - 4;
    const std::string at_limit = start + filler_name + std::string(fill, 'a') + "\r\n\r\n";
    REQUIRE(at_limit.size() == ProxyRequestReader::max_head_bytes);
    CHECK(accepted(at_limit + "tunnel").early == "tunnel");
    const std::string over = start + filler_name + std::string(fill + 1, 'a') + "\r\n\r\n";
    CHECK(refusal(over) == "the request's head is over 16384 bytes");
    CHECK(refusal(start + "X: " + std::string(100'000, 'a')) == "the request's head is over 16384 bytes");

    std::string fields;
    for (int i = 0; i < 100; ++i)
        fields += "X-" + std::to_string(i) + ": v\r\n";
    CHECK(accepted(get("http://example.com/", fields)).upstream_head.ends_with("X-99: v\r\nConnection: close\r\n\r\n"));
    CHECK(refusal(get("http://example.com/", fields + "X-100: v\r\n")) == "the request has over 100 header fields");
    // Fields without values count as much.
    std::string empty;
    for (int i = 0; i < 101; ++i)
        empty += "X-" + std::to_string(i) + ":\r\n";
    CHECK(refusal(get("http://example.com/", empty)) == "the request has over 100 header fields");
}

TEST_CASE("refused: fields with control characters, names that are no tokens, folded lines")
{
    CHECK(refusal(get("http://example.com/", "X-Bad: a\x01z\r\n")) ==
          "not an HTTP/1.1 proxy request (invalid character in header)");
    CHECK(refusal(get("http://example.com/", "X-Bad: a\x7fz\r\n")) ==
          "not an HTTP/1.1 proxy request (invalid character in header)");
    CHECK(refusal(get("http://example.com/", "Foo Bar: baz\r\n")) == "the header field name 'Foo Bar' is not a token");
    CHECK(refusal(get("http://example.com/", "X-A: a\r\n b\r\n")) ==
          "a header line begins with whitespace (obsolete line folding)");
    CHECK(refusal(get("http://example.com/", " X-A: a\r\n")) ==
          "a header line begins with whitespace (obsolete line folding)");
    CHECK(refusal("CONNECT example.com:443 HTTP/1.1\r\nX-A: a\r\n\tb\r\n\r\n") ==
          "a header line begins with whitespace (obsolete line folding)");
    // http_parser, lenient, lets a NUL through at a value's start, and takes a bare CR there
    // as the line's end, swallowing the byte after it: without the reader's own checks the
    // head would end early and the fields after it go upstream as body bytes.
    CHECK(refusal(get("http://example.com/", std::string("X-P:\x00" "1\r\n", 8))) ==
          "the header field X-P has a control character in its value");
    CHECK(refusal(get("http://example.com/", "Expect: \r\x87\n")) == "a bare CR in the request's head");
    CHECK(refusal("CONNECT example.com:443 HTTP/1.1\r\nX-P:\r1\r\n\r\n") == "a bare CR in the request's head");
    CHECK(refusal("GET http://example.com/ HTTP/1.1\r\nX-P:\rX\nHost: evil.example\r\n\r\n") ==
          "a bare CR in the request's head");
    // The fuzzer's finding (tests/fuzz/crashes/egress_request-bare-cr-ends-head): a bare CR at
    // a line's start ended the head there, the line after it taken for the body.
    CHECK(refusal("PUT http://[::1]/x HTTP/1.1\r\nProxy-Connection: keep-alive\r\n\runkepl HT\xff" "d\r\n\r\n"
                  "6\r\nhello\r\n0\r\n\r\n") == "a bare CR in the request's head");
    // A tab inside a value is no control character to refuse; bytes above 0x7f are obs-text.
    CHECK(accepted(get("http://example.com/", "X-A: a\tb\r\nX-B: \xc3\xa9\r\n")).upstream_head ==
          "GET / HTTP/1.1\r\nHost: example.com\r\nX-A: a\tb\r\nX-B: \xc3\xa9\r\nConnection: close\r\n\r\n");
}

TEST_CASE("refused: requests that are not for a proxy, and schemes other than http")
{
    const std::string origin = "not a proxy request: the target is a path (origin-form); a proxy takes an absolute URI "
                               "(http://host/path) or CONNECT host:port";
    CHECK(refusal(get("/x")) == "GET /x: " + origin);
    CHECK(refusal("OPTIONS * HTTP/1.1\r\n\r\n") == "OPTIONS *: " + origin);
    CHECK(refusal(get("https://example.com/")) ==
          "GET https://example.com/: an https:// URI: TLS goes through a CONNECT tunnel (HTTPS_PROXY), not a plain "
          "proxy request");
    CHECK(refusal(get("ftp://example.com/f")) ==
          "GET ftp://example.com/f: the scheme 'ftp': only http:// URIs and CONNECT tunnels are proxied");
    CHECK(refusal(get("http://example.com/a\tb")) ==
          "GET http://example.com/a\\x09b: the URI's path has a control character in it");
}

TEST_CASE("refused: userinfo, ports out of range, missing and bad hosts")
{
    const std::string userinfo = "userinfo (user@host) is not taken: credentials are not passed on";
    CHECK(refusal(get("http://user:pass@example.com/")) == "GET http://user:pass@example.com/: " + userinfo);
    CHECK(refusal("CONNECT user@example.com:443 HTTP/1.1\r\n\r\n") == "CONNECT user@example.com:443: " + userinfo);

    CHECK(refusal(get("http://example.com:0/")) == "GET http://example.com:0/: the port 0 is not from 1 to 65535");
    CHECK(refusal(get("http://example.com:65536/")) ==
          "GET http://example.com:65536/: the port 65536 is not from 1 to 65535");
    CHECK(refusal("CONNECT example.com:99999999999 HTTP/1.1\r\n\r\n") ==
          "CONNECT example.com:99999999999: the port '99999999999' is not a number from 1 to 65535");
    CHECK(refusal("CONNECT example.com:0 HTTP/1.1\r\n\r\n") ==
          "CONNECT example.com:0: the port 0 is not from 1 to 65535");
    CHECK(refusal(get("http://example.com:/")) ==
          "GET http://example.com:/: the port '' is not a number from 1 to 65535");

    CHECK(contains(refusal(get("http:///path")), "no host"));
    CHECK(refusal("CONNECT :443 HTTP/1.1\r\n\r\n") == "CONNECT :443: host '': the name is empty");
    CHECK(refusal(get("http://-bad-.example/")) ==
          "GET http://-bad-.example/: host '-bad-.example': label '-bad-' begins or ends with '-'");
    CHECK(refusal(get("http://a..b/")) == "GET http://a..b/: host 'a..b': the name has an empty label (a leading dot or two dots in a row)");
    CHECK(refusal(get("http://127.1/")) ==
          "GET http://127.1/: host '127.1': neither an IP address (give a dotted quad) nor a DNS name (its last label is a number)");
    CHECK(refusal("CONNECT 0x7f000001:443 HTTP/1.1\r\n\r\n") ==
          "CONNECT 0x7f000001:443: host '0x7f000001': neither an IP address (give a dotted quad) nor a DNS "
          "name (its last label is a number)");
    CHECK(refusal(get("http://[1.2.3.4]/")) == "GET http://[1.2.3.4]/: '[1.2.3.4]' is not an IPv6 address");
    CHECK(refusal(get("http://[fe80::1%25eth0]/")) ==
          "GET http://[fe80::1%25eth0]/: '[fe80::1%25eth0]' is not an IPv6 address");
    CHECK(refusal("CONNECT [::1 HTTP/1.1\r\n\r\n") == "CONNECT [::1: a '[' without its ']'");
    CHECK(refusal("CONNECT ::1:443 HTTP/1.1\r\n\r\n") ==
          "CONNECT ::1:443: an IPv6 address takes brackets: [address]:port");
    CHECK(refusal("CONNECT [::1]x HTTP/1.1\r\n\r\n") == "CONNECT [::1]x: something other than :port follows the host");
    CHECK(refusal("CONNECT " + std::string(254, 'a') + ":443 HTTP/1.1\r\n\r\n").ends_with(
        ": the name is longer than 253 characters"));
    CHECK(refusal("CONNECT " + std::string(64, 'a') + ".example:443 HTTP/1.1\r\n\r\n").ends_with(
        "' is longer than 63 characters"));
}

TEST_CASE("refused: CONNECT without a port or with a URI, authority-form for another method")
{
    CHECK(refusal("CONNECT example.com HTTP/1.1\r\n\r\n") == "CONNECT example.com: no port: the target is host:port");
    CHECK(refusal("CONNECT http://example.com:443/ HTTP/1.1\r\n\r\n") ==
          "CONNECT takes host:port, not 'http://example.com:443/'");
    const std::string authority =
        " takes an absolute http:// URI: a host:port target (authority-form) is for CONNECT only";
    CHECK(refusal(get("example.com:443")) == "GET" + authority);
    CHECK(refusal("POST localhost:8080 HTTP/1.1\r\n\r\n") == "POST" + authority);
}

TEST_CASE("refused: garbage, versions other than 1.0 and 1.1, framing that cannot be spliced")
{
    CHECK(refusal(std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11)) ==
          "not an HTTP/1.1 proxy request (invalid HTTP method)");
    CHECK(refusal("FOO http://example.com/ HTTP/1.1\r\n\r\n") == "not an HTTP/1.1 proxy request (invalid HTTP method)");
    CHECK(refusal("GET http://example.com/ HTTP/2.0\r\n\r\n") == "HTTP/2.0: only HTTP/1.1 and HTTP/1.0 are proxied");
    CHECK(refusal("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") == "not an HTTP/1.1 proxy request (invalid HTTP method)");
    CHECK(refusal("GET http://example.com/ HTTP/1.1 extra\r\n\r\n").starts_with("not an HTTP/1.1 proxy request ("));
    CHECK(refusal(get("http://example.com/", "Transfer-Encoding: chunked, gzip\r\n")) ==
          "a Transfer-Encoding whose last coding is not chunked: the body's length is unknown");
    CHECK(refusal(get("http://example.com/", "Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n")) ==
          "a Transfer-Encoding whose last coding is not chunked: the body's length is unknown");
    CHECK(refusal("POST http://example.com/ HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n") ==
          "Transfer-Encoding in an HTTP/1.0 request");
    CHECK(refusal(get("http://example.com/", "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n")) ==
          "not an HTTP/1.1 proxy request (unexpected content-length header)");
    CHECK(refusal(get("http://example.com/", "Content-Length: 3\r\nContent-Length: 4\r\n")) ==
          "not an HTTP/1.1 proxy request (unexpected content-length header)");
    CHECK(refusal(get("http://example.com/", "Content-Length: x\r\n")) ==
          "not an HTTP/1.1 proxy request (invalid character in content-length header)");
}

TEST_CASE("refused: the connection ending before the head is whole")
{
    CHECK(refusal("", true) == "the connection ended before a request");
    CHECK(refusal("CONNECT example.com:443 HTTP/1.1\r\nHost: exa", true) ==
          "the connection ended before the request's head was whole");
    CHECK(refusal("GET http://example.com/ HTTP/1.1\r\n", true) ==
          "the connection ended before the request's head was whole");
}

TEST_CASE("guest text in a reason is escaped and cut short")
{
    const std::string reason = refusal(get("ftp\x7f://x/"));
    CHECK(reason.starts_with("not an HTTP/1.1 proxy request"));
    const std::string long_scheme = refusal(get(std::string(200, 'z') + "://x/"));
    CHECK(long_scheme.size() < 300);
    CHECK(contains(long_scheme, "zzz...': only http:// URIs"));
    const std::string escaped = refusal(get("http://example.com/", "X\x80Y: v\r\n"));
    CHECK(escaped.starts_with("not an HTTP/1.1 proxy request"));
}

TEST_CASE("the answers' exact bytes")
{
    CHECK(proxy_established_answer() == "HTTP/1.1 200 Connection established\r\n\r\n");
    CHECK(proxy_refusal_answer(ProxyRefusalStatus::forbidden, "pypi.org:443: no allow rule matches") ==
          "HTTP/1.1 403 Forbidden\r\n"
          "Content-Type: text/plain\r\n"
          "Content-Length: 52\r\n"
          "Connection: close\r\n"
          "\r\n"
          "agentvm egress: pypi.org:443: no allow rule matches\n");
    const std::pair<ProxyRefusalStatus, const char*> statuses[] = {
        {ProxyRefusalStatus::bad_request, "400 Bad Request"},
        {ProxyRefusalStatus::forbidden, "403 Forbidden"},
        {ProxyRefusalStatus::too_many_requests, "429 Too Many Requests"},
        {ProxyRefusalStatus::bad_gateway, "502 Bad Gateway"},
        {ProxyRefusalStatus::gateway_timeout, "504 Gateway Timeout"},
    };
    for (const auto& [status, line] : statuses)
        CHECK(proxy_refusal_answer(status, "x") == std::string("HTTP/1.1 ") + line +
                                                       "\r\nContent-Type: text/plain\r\nContent-Length: 18\r\n"
                                                       "Connection: close\r\n\r\nagentvm egress: x\n");
}

TEST_CASE("an answer's reason: no CR, LF or other control character, ASCII, at most 512 bytes")
{
    CHECK(proxy_reason_text("a\r\nb\x01" "c\x7f" "d\xc3\xa9" "e\tf") == "a  b c d??e f");
    CHECK(proxy_refusal_answer(ProxyRefusalStatus::bad_gateway, "x\r\n\r\nHTTP/1.1 200 OK\r\n") ==
          "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nContent-Length: 39\r\nConnection: close\r\n\r\n"
          "agentvm egress: x    HTTP/1.1 200 OK  \n");
    const std::string exactly(max_proxy_reason_bytes, 'r');
    CHECK(proxy_reason_text(exactly) == exactly);
    const std::string cut = proxy_reason_text(exactly + "s");
    CHECK(cut.size() == max_proxy_reason_bytes);
    CHECK(cut.ends_with("rrr..."));
    CHECK(proxy_reason_text(std::string(1'000'000, '\n')).size() == max_proxy_reason_bytes);
    const std::string answer = proxy_refusal_answer(ProxyRefusalStatus::forbidden, std::string(5000, 'x'));
    CHECK(contains(answer, "Content-Length: 529\r\n"));  // "agentvm egress: " + 512 + "\n"
}
