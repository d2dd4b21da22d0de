// What serve without a token takes as a request from this host's own clients
// (service/local_client.hpp): the Host and Origin headers a browser sends for a web page of
// another site, cross-site or through DNS rebinding, are refused.
#include <doctest/doctest.h>

#include "service/local_client.hpp"

using namespace agentvm;

TEST_CASE("a Host naming a loopback address, with or without its port")
{
    for (const char* host : {"localhost", "LocalHost", "localhost:8080", "127.0.0.1", "127.0.0.1:1",
                             "127.255.3.4:65535", "[::1]", "[::1]:8080", "[0:0:0:0:0:0:0:1]:80"})
        CHECK_MESSAGE(is_loopback_host(host), host);
    for (const char* host : {"", "evil.example", "evil.example:8080", "localhost.evil.example",
                             "127.0.0.1.evil.example", "localhost.", "128.0.0.1", "0.0.0.0", "10.0.0.1:80", "[::2]",
                             "[::ffff:8.8.8.8]", "::1",
                             "localhost:", "localhost:80a", "localhost:123456", "127.1", "0x7f.0.0.1", "2130706433",
                             "[::1", "localhost:80:80", "user@localhost"})
        CHECK_MESSAGE(!is_loopback_host(host), host);
}

TEST_CASE("an Origin of a page served from a loopback address")
{
    for (const char* origin : {"http://localhost", "http://localhost:3000", "https://127.0.0.1:8443", "http://[::1]:80",
                               "HTTP://LOCALHOST"})
        CHECK_MESSAGE(is_loopback_origin(origin), origin);
    for (const char* origin : {"null", "", "http://", "http://evil.example", "https://evil.example:443",
                               "http://localhost.evil.example", "file://", "ftp://localhost", "localhost",
                               "http://127.0.0.1/path", "chrome-extension://abcdef"})
        CHECK_MESSAGE(!is_loopback_origin(origin), origin);
}
