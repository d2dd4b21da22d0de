// Socket activation (service/systemd/listen_fds.hpp): listening sockets passed as systemd passes
// them (descriptors from 3, LISTEN_PID, LISTEN_FDS, LISTEN_FDNAMES) are taken and described;
// variables meant for another process are left alone; anything else is refused by name.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/fd.hpp"
#include "service/systemd/listen_fds.hpp"

using namespace agentvm;

namespace {

constexpr int first_fd = 3;

// The test's own sockets live high up, so that descriptors from 3 stay free for passing.
Fd high(Fd fd)
{
    REQUIRE(fd);
    Fd moved(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 64));
    REQUIRE(moved);
    return moved;
}

Fd tcp_listener()
{
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(fd);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    REQUIRE(::listen(fd.get(), 8) == 0);
    return high(std::move(fd));
}

Fd unix_listener(const std::string& path)
{
    Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(fd);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, path.data(), path.size());
    ::unlink(path.c_str());
    REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    REQUIRE(::listen(fd.get(), 8) == 0);
    return high(std::move(fd));
}

uint16_t port_of(const Fd& fd)
{
    sockaddr_in address{};
    socklen_t length = sizeof address;
    REQUIRE(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &length) == 0);
    return ntohs(address.sin_port);
}

// Puts `sockets` at descriptors 3, 4, ... as systemd would (without close-on-exec) and sets the
// variables; the descriptors are closed again when the returned owners go.
std::vector<Fd> pass(const std::vector<const Fd*>& sockets, const std::string& pid, const std::string& names)
{
    std::vector<Fd> passed;
    for (size_t i = 0; i < sockets.size(); ++i) {
        const int target = first_fd + static_cast<int>(i);
        // Descriptors from 3 must be free in this test process, or the test would close one it uses.
        REQUIRE(::fcntl(target, F_GETFD) == -1);
        REQUIRE(::dup2(sockets[i]->get(), target) == target);
        passed.emplace_back(target);
    }
    ::setenv("LISTEN_PID", pid.c_str(), 1);
    ::setenv("LISTEN_FDS", std::to_string(sockets.size()).c_str(), 1);
    if (names.empty())
        ::unsetenv("LISTEN_FDNAMES");
    else
        ::setenv("LISTEN_FDNAMES", names.c_str(), 1);
    return passed;
}

std::string self() { return std::to_string(::getpid()); }

bool variables_gone()
{
    return !std::getenv("LISTEN_PID") && !std::getenv("LISTEN_FDS") && !std::getenv("LISTEN_FDNAMES");
}

} // namespace

TEST_CASE("a TCP and a Unix socket, named, taken as listeners and described")
{
    const Fd tcp = tcp_listener();
    const std::string path = fmt::format("/tmp/agentvm-listen-fds-test-{}.sock", ::getpid());
    const Fd unix_socket = unix_listener(path);
    const auto passed = pass({&tcp, &unix_socket}, self(), "http:agent-check");
    const std::vector<InheritedSocket> sockets = take_inherited_sockets();
    REQUIRE(sockets.size() == 2);
    CHECK(sockets[0].name == "http");
    CHECK(sockets[0].spec.tcp);
    CHECK(sockets[0].spec.host == "127.0.0.1");
    CHECK(sockets[0].spec.port == port_of(tcp));
    CHECK(sockets[0].spec.loopback());
    CHECK(sockets[0].spec.inherited_fd == first_fd);
    CHECK(sockets[0].spec.text() == fmt::format("tcp:127.0.0.1:{} (from systemd)", port_of(tcp)));
    CHECK(sockets[1].name == "agent-check");
    CHECK_FALSE(sockets[1].spec.tcp);
    CHECK(sockets[1].spec.path == path);
    CHECK(sockets[1].spec.inherited_fd == first_fd + 1);
    for (const InheritedSocket& socket : sockets) {
        CHECK((::fcntl(socket.spec.inherited_fd, F_GETFD) & FD_CLOEXEC) != 0);
        CHECK((::fcntl(socket.spec.inherited_fd, F_GETFL) & O_NONBLOCK) != 0);
    }
    CHECK(variables_gone());
    ::unlink(path.c_str());
}

TEST_CASE("without names, each socket's name is empty")
{
    const Fd tcp = tcp_listener();
    const auto passed = pass({&tcp}, self(), "");
    const auto sockets = take_inherited_sockets();
    REQUIRE(sockets.size() == 1);
    CHECK(sockets[0].name.empty());
}

TEST_CASE("variables meant for another process, or none: nothing taken, and they are unset")
{
    const Fd tcp = tcp_listener();
    const auto passed = pass({&tcp}, std::to_string(::getpid() + 1), "");
    CHECK(take_inherited_sockets().empty());
    CHECK(variables_gone());
    CHECK(take_inherited_sockets().empty());
}

TEST_CASE("malformed variables and sockets serve cannot listen on are refused by name")
{
    SUBCASE("LISTEN_FDS not a number")
    {
        ::setenv("LISTEN_PID", self().c_str(), 1);
        ::setenv("LISTEN_FDS", "two", 1);
        CHECK_THROWS_WITH_AS(take_inherited_sockets(), doctest::Contains("LISTEN_FDS='two'"), Error);
    }
    SUBCASE("LISTEN_PID not a number")
    {
        ::setenv("LISTEN_PID", "12x", 1);
        ::setenv("LISTEN_FDS", "1", 1);
        CHECK_THROWS_WITH_AS(take_inherited_sockets(), doctest::Contains("LISTEN_PID='12x'"), Error);
    }
    SUBCASE("more names than sockets")
    {
        const Fd tcp = tcp_listener();
        const auto passed = pass({&tcp}, self(), "http:agent-check");
        CHECK_THROWS_WITH_AS(take_inherited_sockets(), doctest::Contains("LISTEN_FDNAMES"), Error);
    }
    SUBCASE("a socket that does not listen (as with Accept=yes)")
    {
        const Fd connected = high(Fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)));
        const auto passed = pass({&connected}, self(), "http");
        CHECK_THROWS_WITH_AS(take_inherited_sockets(), doctest::Contains("not listening"), Error);
    }
    SUBCASE("a datagram socket")
    {
        const Fd datagram = high(Fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)));
        const auto passed = pass({&datagram}, self(), "http");
        CHECK_THROWS_WITH_AS(take_inherited_sockets(), doctest::Contains("not a stream socket"), Error);
    }
    SUBCASE("not a socket at all")
    {
        const Fd file = high(Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC)));
        const auto passed = pass({&file}, self(), "http");
        CHECK_THROWS_WITH_AS(take_inherited_sockets(), doctest::Contains("not a socket"), Error);
    }
    CHECK(variables_gone());
}
