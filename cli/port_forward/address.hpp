// The two addresses `agentvm port-forward` is given, parsed and checked before any socket is
// made: where it listens (--listen HOST:PORT or unix:PATH) and where serve is (--serve, the
// forms the Python client takes, plus serve's own --listen forms).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace agentvm {

struct Endpoint {
    bool unix_socket = false;
    std::string path;  // unix_socket
    std::string host;  // TCP: a name or an address, IPv6 without its brackets
    uint16_t port = 0;

    // unix:PATH, HOST:PORT or [IPV6]:PORT.
    std::string text() const;
};

// --listen: HOST:PORT or [IPV6]:PORT (port 0: the kernel picks a free one), or unix:PATH.
// Throws Error naming the flag and the problem.
Endpoint parse_listen_address(std::string_view text);

// A Unix socket's path given to `flag` (--uds): fits in sun_path, has no NUL. Throws Error.
Endpoint parse_unix_path(std::string_view flag, std::string_view path);

struct ServeUrl {
    Endpoint endpoint;
    std::string host_header;  // the request's Host: HOST[:PORT], or localhost on a Unix socket
    std::string prefix;       // a path in front of /v1/..., without a trailing '/' ("" for none)
};

// --serve: http://HOST[:PORT][/PREFIX] (port 80 when not given), unix:PATH (or unix://PATH), or
// serve's own --listen forms tcp:HOST:PORT and unix:PATH. Throws Error naming the problem.
ServeUrl parse_serve_url(std::string_view text);

} // namespace agentvm
