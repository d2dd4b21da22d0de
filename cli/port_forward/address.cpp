#include "cli/port_forward/address.hpp"

#include <sys/un.h>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/whole_number.hpp"

namespace agentvm {
namespace {

// sun_path holds the path and its terminating NUL.
constexpr size_t max_unix_path = sizeof(sockaddr_un::sun_path) - 1;

std::string unix_path(std::string_view flag, std::string_view text, std::string_view path)
{
    if (path.empty())
        throw Error(fmt::format("{} {}: give a socket path after unix:", flag, text));
    if (path.size() > max_unix_path)
        throw Error(fmt::format("{} {}: a Unix socket path has at most {} bytes", flag, text, max_unix_path));
    if (path.find('\0') != std::string_view::npos)
        throw Error(fmt::format("{} {}: the path has a NUL byte", flag, text));
    return std::string(path);
}

// HOST:PORT or [IPV6]:PORT, or HOST alone when default_port is given.
Endpoint host_and_port(std::string_view flag, std::string_view text, std::string_view authority,
                       int default_port, bool zero_allowed)
{
    Endpoint endpoint;
    std::string_view port;
    bool has_port = false;
    if (authority.starts_with("[")) {
        const size_t close = authority.find(']');
        if (close == std::string_view::npos || close == 1)
            throw Error(fmt::format("{} {}: an IPv6 address goes in brackets: [ADDRESS]:PORT", flag, text));
        endpoint.host = std::string(authority.substr(1, close - 1));
        const std::string_view rest = authority.substr(close + 1);
        if (!rest.empty()) {
            if (rest[0] != ':')
                throw Error(fmt::format("{} {}: expected ':' and a port after ']'", flag, text));
            port = rest.substr(1);
            has_port = true;
        }
    } else {
        const size_t colon = authority.rfind(':');
        if (colon != std::string_view::npos) {
            endpoint.host = std::string(authority.substr(0, colon));
            port = authority.substr(colon + 1);
            has_port = true;
        } else {
            endpoint.host = std::string(authority);
        }
        if (endpoint.host.find(':') != std::string::npos)
            throw Error(fmt::format("{} {}: an IPv6 address goes in brackets: [ADDRESS]:PORT", flag, text));
    }
    if (endpoint.host.empty())
        throw Error(fmt::format("{} {}: no host before the port", flag, text));
    if (endpoint.host.find_first_of(" \t\r\n/@?#") != std::string::npos)
        throw Error(fmt::format("{} {}: '{}' is not a host name or address", flag, text, endpoint.host));
    if (!has_port) {
        if (default_port < 0)
            throw Error(fmt::format("{} {}: expected HOST:PORT", flag, text));
        endpoint.port = static_cast<uint16_t>(default_port);
        return endpoint;
    }
    const std::optional<uint16_t> value = port_number(port, zero_allowed);
    if (!value)
        throw Error(fmt::format("{} {}: the port must be a number from {} to 65535", flag, text,
                                zero_allowed ? 0 : 1));
    endpoint.port = *value;
    return endpoint;
}

} // namespace

std::string Endpoint::text() const
{
    if (unix_socket)
        return "unix:" + path;
    return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

Endpoint parse_listen_address(std::string_view text)
{
    constexpr std::string_view flag = "--listen";
    if (text.starts_with("unix:")) {
        Endpoint endpoint;
        endpoint.unix_socket = true;
        endpoint.path = unix_path(flag, text, text.substr(5));
        return endpoint;
    }
    if (text.find(':') == std::string_view::npos)
        throw Error(fmt::format("--listen {}: expected HOST:PORT (port 0 picks a free one) or unix:PATH", text));
    return host_and_port(flag, text, text, -1, true);
}

Endpoint parse_unix_path(std::string_view flag, std::string_view path)
{
    if (path.empty())
        throw Error(fmt::format("{}: give the socket's path", flag));
    Endpoint endpoint;
    endpoint.unix_socket = true;
    endpoint.path = unix_path(flag, path, path);
    return endpoint;
}

ServeUrl parse_serve_url(std::string_view text)
{
    constexpr std::string_view flag = "--serve";
    ServeUrl url;
    if (text.starts_with("unix:")) {
        std::string_view path = text.substr(5);
        if (path.starts_with("//"))
            path.remove_prefix(2);
        url.endpoint.unix_socket = true;
        url.endpoint.path = unix_path(flag, text, path);
        url.host_header = "localhost";
        return url;
    }
    if (text.starts_with("https://"))
        throw Error(fmt::format("--serve {}: https is not supported: give serve's http:// address or its "
                                "unix:PATH socket (through an SSH tunnel, say)",
                                text));
    std::string_view authority;
    std::string_view path;
    int default_port = -1;
    if (text.starts_with("http://")) {
        const std::string_view rest = text.substr(7);
        const size_t slash = rest.find('/');
        authority = rest.substr(0, slash);
        path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
        default_port = 80;
    } else if (text.starts_with("tcp:")) {
        authority = text.substr(4);
    } else {
        throw Error(fmt::format("--serve {}: expected http://HOST:PORT or unix:PATH", text));
    }
    if (authority.find('@') != std::string_view::npos)
        throw Error(fmt::format("--serve {}: no user in the URL: give the token with --token-file or AGENTVM_TOKEN",
                                text));
    if (path.find_first_of("?# \t\r\n") != std::string_view::npos)
        throw Error(fmt::format("--serve {}: the URL may have a path, but no query, fragment or space", text));
    url.endpoint = host_and_port(flag, text, authority, default_port, false);
    const bool ipv6 = url.endpoint.host.find(':') != std::string::npos;
    url.host_header = ipv6 ? "[" + url.endpoint.host + "]" : url.endpoint.host;
    if (url.endpoint.port != 80)
        url.host_header += fmt::format(":{}", url.endpoint.port);
    while (path.ends_with("/"))
        path.remove_suffix(1);
    url.prefix = std::string(path);
    return url;
}

} // namespace agentvm
