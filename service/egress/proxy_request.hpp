// Reads the first request on a connection to the host's egress proxy (issue 29): what a tool in
// the sandbox (pip, curl, git, urllib through HTTP_PROXY/HTTPS_PROXY) sends, relayed unchanged
// by the guest over vsock. The guest is hostile. Read through http_parser (nodejs/http-parser,
// as guest_http_response.hpp does), in pieces as a socket hands them over; the outcome is a
// ProxyRequest or a ProxyRefusal, never an exception.
//
// Two forms are taken (RFC 9112 3.2.3 and 3.2.2):
//   CONNECT host:port HTTP/1.1     a tunnel: the proxy answers 200 and splices bytes both ways
//   GET http://host[:port]/p?q     plain HTTP: the proxy sends `upstream_head` (origin-form,
//                                  GET /p?q) to host:port (80 by default), then splices
// host is a DNS name, a dotted quad or an [IPv6] address. Refused: origin-form (GET /x: not a
// proxy request), https:// URIs (TLS goes through CONNECT), any other scheme, userinfo, a port
// out of 1..65535, a bad host, authority-form with another method than CONNECT, HTTP other
// than 1.0 and 1.1, a head over max_head_bytes or max_fields, a field name that is no token,
// a field value with a control character, obsolete line folding, a bare CR, a
// Transfer-Encoding whose last coding is not chunked (RFC 9112 6.3) or in an HTTP/1.0 request.
//
// Plain HTTP's head is rewritten as RFC 9110 7.6 asks of a proxy: Host replaced by the URI's
// authority (RFC 9112 3.2.2: a proxy ignores the Host a client sent with an absolute URI, so
// a name the policy did not judge cannot reach the server), hop-by-hop fields dropped
// (Connection and those it names, Proxy-Connection, Keep-Alive, Proxy-Authorization, TE,
// Upgrade), and "Connection: close": one request per upstream connection, and the proxy
// closes after the answer (keep-alive to the proxy is not supported). The body's framing
// (Content-Length, Transfer-Encoding) passes unchanged, since the body is spliced raw: the
// body bytes that came with the head are in `early`, the rest follows on the connection.
//
// Pure: no DNS, no sockets.
#pragma once

#include <http_parser.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "service/egress/address_class.hpp"

namespace agentvm {

struct ProxyDestination {
    // A DNS name (lower-case, without its trailing dot), a dotted quad, or IPv6 text without
    // brackets: what EgressPolicy::check_name takes.
    std::string host;
    uint16_t port = 0;  // 1..65535
    std::optional<IpAddress> address;  // when host is an IP literal: nothing to resolve

    // "pypi.org:443", "[2001:db8::1]:80": for logs and answers.
    std::string where() const;
};

struct ProxyRequest {
    enum class Kind {
        tunnel,  // CONNECT: answer proxy_established_answer(), then splice
        http,    // an absolute URI: send upstream_head upstream, then splice
    };
    Kind kind = Kind::tunnel;
    std::string method;  // "CONNECT", "GET", ...
    ProxyDestination destination;
    // http only: the head to send upstream, origin-form, ending in CRLF CRLF.
    std::string upstream_head;
    // What came after the head in the piece that completed it: the tunnel's first bytes (a TLS
    // ClientHello), or the first body bytes. To be sent upstream first.
    std::string early;
};

struct ProxyRefusal {
    std::string reason;  // printable ASCII; guest text in it is escaped and cut short
    // The connection ended before the head was whole: there is nothing left to answer.
    bool ended = false;
};

using ProxyReading = std::variant<ProxyRequest, ProxyRefusal>;

class ProxyRequestReader {
public:
    static constexpr size_t max_head_bytes = 16 * 1024;
    static constexpr size_t max_fields = 100;

    ProxyRequestReader();
    ProxyRequestReader(const ProxyRequestReader&) = delete;
    ProxyRequestReader& operator=(const ProxyRequestReader&) = delete;

    // Feeds what came from the guest; an empty piece is the end of the connection. Returns the
    // reading once, when the head is whole or found wanting; nothing before (more is needed)
    // and nothing after (what follows is the caller's to splice, not this reader's).
    std::optional<ProxyReading> feed(std::string_view bytes);
    bool done() const { return done_; }

private:
    static int on_url(http_parser* parser, const char* at, size_t length);
    static int on_field(http_parser* parser, const char* at, size_t length);
    static int on_value(http_parser* parser, const char* at, size_t length);
    static int on_headers_complete(http_parser* parser);
    static int on_message_complete(http_parser* parser);
    // The field read so far into fields_; false (and error_ set) past max_fields.
    bool commit_field();
    ProxyReading read_head(std::string_view rest) const;
    std::string parser_error() const;
    ProxyReading finish(ProxyReading reading);

    http_parser parser_{};
    http_parser_settings settings_{};
    std::string head_;  // the head's bytes as they came, at most max_head_bytes
    std::string url_;
    std::vector<std::pair<std::string, std::string>> fields_;
    std::string field_;
    std::string value_;
    bool in_value_ = false;
    bool head_whole_ = false;
    bool done_ = false;
    std::optional<std::string> error_;
};

} // namespace agentvm
