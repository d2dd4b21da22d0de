// What the host's egress proxy (issue 29) answers a tool in the sandbox, as the bytes to send:
// the CONNECT tunnel's 200, or a refusal the tool shows its user (curl prints the body of an
// answer to a plain request; pip and urllib3 only the status line of a refused CONNECT). A
// refusal is a whole answer, closed after it: "Connection: close", a Content-Length, and a
// one-line text/plain body "agentvm egress: <reason>".
//
// Pure: no sockets.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace agentvm {

enum class ProxyRefusalStatus {
    bad_request = 400,        // the request could not be read (proxy_request.hpp)
    forbidden = 403,          // the egress policy refused the destination
    too_many_requests = 429,  // the sandbox's limit on its connections out
    bad_gateway = 502,        // the name did not resolve, or the connection failed
    gateway_timeout = 504,    // the name or the connection took too long
};

// The most of a reason a refusal's body holds.
constexpr size_t max_proxy_reason_bytes = 512;

// "HTTP/1.1 200 Connection established\r\n\r\n": the tunnel is open.
std::string proxy_established_answer();

// The whole answer: status line, Content-Type, Content-Length, Connection: close, and the
// body "agentvm egress: <reason>\n" with the reason sanitized (proxy_reason_text).
std::string proxy_refusal_answer(ProxyRefusalStatus status, std::string_view reason);

// `reason` as a refusal's body holds it: printable ASCII only (a control character, CR and
// LF included, becomes a space; any other byte '?'), at most max_proxy_reason_bytes, ending in
// "..." when cut.
std::string proxy_reason_text(std::string_view reason);

} // namespace agentvm
