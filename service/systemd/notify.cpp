#include "service/systemd/notify.hpp"

#include <sys/socket.h>
#include <sys/un.h>

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"

namespace agentvm {
namespace {

// The address as sendto() takes it: for an abstract name the leading '@' becomes a NUL, and the
// length counts exactly the name's bytes (an abstract name is not NUL-terminated).
socklen_t notify_sockaddr(const std::string& address, sockaddr_un& out)
{
    out = {};
    out.sun_family = AF_UNIX;
    if (address.size() < 2 || (address.front() != '/' && address.front() != '@'))
        throw Error(fmt::format("NOTIFY_SOCKET '{}': expected an absolute path or '@' and an abstract name", address));
    if (address.size() > sizeof out.sun_path - (address.front() == '/' ? 1 : 0))
        throw Error(fmt::format("NOTIFY_SOCKET '{}': longer than a Unix socket address ({} bytes)", address,
                                sizeof out.sun_path));
    std::memcpy(out.sun_path, address.data(), address.size());
    if (address.front() == '@')
        out.sun_path[0] = '\0';
    return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address.size() +
                                  (address.front() == '/' ? 1 : 0));
}

} // namespace

std::optional<SystemdNotifier> SystemdNotifier::from_environment()
{
    const char* value = std::getenv("NOTIFY_SOCKET");
    if (!value || !*value)
        return std::nullopt;
    const std::string address = value;
    ::unsetenv("NOTIFY_SOCKET");
    return SystemdNotifier(address);
}

SystemdNotifier::SystemdNotifier(const std::string& address) : address_(address)
{
    sockaddr_un checked{};
    notify_sockaddr(address_, checked);
    socket_ = Fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!socket_)
        throw_errno("NOTIFY_SOCKET: creating a datagram socket");
}

void SystemdNotifier::notify(std::string_view state) const
{
    sockaddr_un address{};
    const socklen_t length = notify_sockaddr(address_, address);
    const ssize_t sent = ::sendto(socket_.get(), state.data(), state.size(), MSG_NOSIGNAL | MSG_DONTWAIT,
                                  reinterpret_cast<const sockaddr*>(&address), length);
    if (sent != static_cast<ssize_t>(state.size()))
        spdlog::warn("telling systemd '{}' through NOTIFY_SOCKET {} failed: {}", state, address_,
                     sent < 0 ? std::strerror(errno) : "a short write");
}

void SystemdNotifier::status(std::string_view text) const
{
    std::string line = "STATUS=" + std::string(text);
    for (char& c : line)
        if (c == '\n')
            c = ' ';
    notify(line);
}

} // namespace agentvm
