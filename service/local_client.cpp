#include "service/local_client.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>
#include <string>

namespace agentvm {
namespace {

bool is_port(std::string_view text)
{
    return !text.empty() && text.size() <= 5 &&
           std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool equals_ignoring_case(std::string_view a, std::string_view b)
{
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
           });
}

bool is_loopback_name(std::string_view name)
{
    if (equals_ignoring_case(name, "localhost"))
        return true;
    const std::string text(name);
    if (name.size() > 2 && name.front() == '[' && name.back() == ']') {
        in6_addr v6{};
        return ::inet_pton(AF_INET6, text.substr(1, text.size() - 2).c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
    }
    // inet_pton takes dotted decimal only: no octal, hex or short forms a browser might
    // read otherwise.
    in_addr v4{};
    return ::inet_pton(AF_INET, text.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}

} // namespace

bool is_loopback_host(std::string_view host)
{
    // The port follows the last ':' outside an IPv6 literal's brackets.
    const size_t colon = host.rfind(':');
    if (colon != std::string_view::npos && host.find(']', colon) == std::string_view::npos) {
        if (!is_port(host.substr(colon + 1)))
            return false;
        host = host.substr(0, colon);
    }
    return is_loopback_name(host);
}

bool is_loopback_origin(std::string_view origin)
{
    for (const std::string_view scheme : {"http://", "https://"})
        if (origin.size() > scheme.size() && equals_ignoring_case(origin.substr(0, scheme.size()), scheme))
            return is_loopback_host(origin.substr(scheme.size()));
    return false;
}

} // namespace agentvm
