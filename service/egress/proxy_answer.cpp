#include "service/egress/proxy_answer.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace agentvm {

namespace {

const char* status_text(ProxyRefusalStatus status)
{
    switch (status) {
    case ProxyRefusalStatus::bad_request:
        return "Bad Request";
    case ProxyRefusalStatus::forbidden:
        return "Forbidden";
    case ProxyRefusalStatus::too_many_requests:
        return "Too Many Requests";
    case ProxyRefusalStatus::bad_gateway:
        return "Bad Gateway";
    case ProxyRefusalStatus::gateway_timeout:
        return "Gateway Timeout";
    }
    return "Bad Gateway";
}

} // namespace

std::string proxy_established_answer()
{
    return "HTTP/1.1 200 Connection established\r\n\r\n";
}

std::string proxy_reason_text(std::string_view reason)
{
    // ASCII only, so that the body needs no charset and cutting it splits no character.
    std::string out;
    out.reserve(std::min(reason.size(), max_proxy_reason_bytes));
    for (char c : reason.substr(0, max_proxy_reason_bytes + 1)) {
        const auto byte = static_cast<unsigned char>(c);
        out += byte < 0x20 || byte == 0x7f ? ' ' : byte >= 0x80 ? '?' : c;
    }
    if (out.size() > max_proxy_reason_bytes) {
        out.resize(max_proxy_reason_bytes - 3);
        out += "...";
    }
    return out;
}

std::string proxy_refusal_answer(ProxyRefusalStatus status, std::string_view reason)
{
    const std::string body = "agentvm egress: " + proxy_reason_text(reason) + "\n";
    return fmt::format("HTTP/1.1 {} {}\r\n"
                       "Content-Type: text/plain\r\n"
                       "Content-Length: {}\r\n"
                       "Connection: close\r\n"
                       "\r\n"
                       "{}",
                       static_cast<int>(status), status_text(status), body.size(), body);
}

} // namespace agentvm
