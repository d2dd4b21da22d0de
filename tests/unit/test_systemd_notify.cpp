// serve's readiness reports to systemd (service/systemd/notify.hpp), against real datagram
// sockets standing in for systemd's: a path and an abstract name, as $NOTIFY_SOCKET gives them.
#include <doctest/doctest.h>

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
#include "service/systemd/notify.hpp"

using namespace agentvm;

namespace {

// systemd's end: a datagram socket bound to `address` ("/path" or "@name").
Fd bind_receiver(const std::string& address)
{
    Fd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    REQUIRE(fd);
    sockaddr_un un{};
    un.sun_family = AF_UNIX;
    std::memcpy(un.sun_path, address.data(), address.size());
    socklen_t length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address.size());
    if (address.front() == '@')
        un.sun_path[0] = '\0';
    else
        ++length;
    REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&un), length) == 0);
    return fd;
}

std::string receive(const Fd& fd)
{
    char buffer[4096];
    const ssize_t n = ::recv(fd.get(), buffer, sizeof buffer, MSG_DONTWAIT);
    REQUIRE(n >= 0);
    return std::string(buffer, static_cast<size_t>(n));
}

std::string unique_name(const char* what)
{
    return fmt::format("agentvm-notify-test-{}-{}", ::getpid(), what);
}

} // namespace

TEST_CASE("READY, STATUS and STOPPING reach a socket named by a path, one datagram each")
{
    const std::string path = "/tmp/" + unique_name("path");
    ::unlink(path.c_str());
    const Fd receiver = bind_receiver(path);
    const SystemdNotifier notifier(path);
    notifier.notify("READY=1\nSTATUS=serving on unix:/run/agentvm/serve.sock");
    notifier.status("two\nlines");
    notifier.notify("STOPPING=1");
    CHECK(receive(receiver) == "READY=1\nSTATUS=serving on unix:/run/agentvm/serve.sock");
    CHECK(receive(receiver) == "STATUS=two lines");
    CHECK(receive(receiver) == "STOPPING=1");
    ::unlink(path.c_str());
}

TEST_CASE("an abstract socket: '@' is a NUL and the name is not NUL-terminated")
{
    const std::string address = "@" + unique_name("abstract");
    const Fd receiver = bind_receiver(address);
    SystemdNotifier(address).notify("READY=1");
    CHECK(receive(receiver) == "READY=1");
}

TEST_CASE("from the environment: taken once, then unset so that children do not report")
{
    const std::string address = "@" + unique_name("environment");
    const Fd receiver = bind_receiver(address);
    REQUIRE(::setenv("NOTIFY_SOCKET", address.c_str(), 1) == 0);
    const auto notifier = SystemdNotifier::from_environment();
    REQUIRE(notifier);
    CHECK(std::getenv("NOTIFY_SOCKET") == nullptr);
    notifier->notify("READY=1");
    CHECK(receive(receiver) == "READY=1");
    CHECK_FALSE(SystemdNotifier::from_environment());
    REQUIRE(::setenv("NOTIFY_SOCKET", "", 1) == 0);
    CHECK_FALSE(SystemdNotifier::from_environment());
}

TEST_CASE("an address that cannot be a socket is refused by name")
{
    for (const std::string& bad : std::vector<std::string>{"relative/path", "@", "/", std::string(200, '/')}) {
        CAPTURE(bad);
        CHECK_THROWS_WITH_AS(SystemdNotifier{bad}, doctest::Contains("NOTIFY_SOCKET"), Error);
    }
}

TEST_CASE("nobody listening: the report is lost, serve goes on")
{
    const SystemdNotifier notifier("/tmp/" + unique_name("nobody"));
    CHECK_NOTHROW(notifier.notify("READY=1"));
}
