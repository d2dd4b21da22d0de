#include "service/ports/guest_request_head.hpp"

#include <strings.h>

#include <algorithm>
#include <array>
#include <string_view>

namespace agentvm {

namespace {

bool same_name(std::string_view a, std::string_view b)
{
    return a.size() == b.size() && ::strncasecmp(a.data(), b.data(), a.size()) == 0;
}

// Whether a comma-separated header value lists `token` (Connection: keep-alive, Upgrade).
bool lists_token(std::string_view value, std::string_view token)
{
    while (!value.empty()) {
        const size_t comma = value.find(',');
        std::string_view item = value.substr(0, comma);
        while (!item.empty() && (item.front() == ' ' || item.front() == '\t'))
            item.remove_prefix(1);
        while (!item.empty() && (item.back() == ' ' || item.back() == '\t'))
            item.remove_suffix(1);
        if (same_name(item, token))
            return true;
        if (comma == std::string_view::npos)
            break;
        value.remove_prefix(comma + 1);
    }
    return false;
}

} // namespace

bool hop_by_hop_header(const std::string& name)
{
    // Expect too: MHD has answered "100-continue" to the client itself.
    static constexpr std::array<std::string_view, 10> hop = {"Connection", "Keep-Alive",      "Proxy-Connection", "Expect",
                                                            "TE",         "Trailer",         "Transfer-Encoding",
                                                            "Upgrade",    "Content-Length", "Proxy-Authorization"};
    return std::any_of(hop.begin(), hop.end(), [&](std::string_view h) { return same_name(name, h); });
}

GuestRequestHead guest_request_head(const std::string& method, const std::string& target, const HeaderList& headers,
                                    const std::vector<std::string>& strip)
{
    GuestRequestHead head;
    std::optional<std::string> content_length;
    std::optional<std::string> upgrade;
    bool connection_upgrade = false;
    for (const auto& [name, value] : headers) {
        if (same_name(name, "Content-Length"))
            content_length = value;
        else if (same_name(name, "Transfer-Encoding"))
            head.framing = BodyFraming::chunked;  // MHD refuses every other coding (http_server.cpp)
        else if (same_name(name, "Upgrade"))
            upgrade = value;
        else if (same_name(name, "Connection"))
            connection_upgrade = connection_upgrade || lists_token(value, "upgrade");
    }
    if (head.framing != BodyFraming::chunked && content_length && *content_length != "0")
        head.framing = BodyFraming::length;
    head.upgrade = upgrade && connection_upgrade;

    head.text = method + " " + target + " HTTP/1.1\r\n";
    for (const auto& header : headers) {
        const std::string& name = header.first;
        if (hop_by_hop_header(name)
            || std::any_of(strip.begin(), strip.end(), [&](const std::string& s) { return same_name(name, s); }))
            continue;
        head.text += name + ": " + header.second + "\r\n";
    }
    if (head.framing == BodyFraming::length)
        head.text += "Content-Length: " + *content_length + "\r\n";
    else if (head.framing == BodyFraming::chunked)
        head.text += "Transfer-Encoding: chunked\r\n";
    if (head.upgrade)
        head.text += "Connection: Upgrade\r\nUpgrade: " + *upgrade + "\r\n";
    else
        head.text += "Connection: close\r\n";
    head.text += "\r\n";
    return head;
}

} // namespace agentvm
