#include "service/systemd/listen_fds.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/whole_number.hpp"

namespace agentvm {
namespace {

// sd_listen_fds(3): the first passed descriptor.
constexpr int first_passed_fd = 3;
// More than any serve listens on; a larger count is a mistake, not a configuration.
constexpr unsigned max_passed_fds = 64;

std::string take_listen_variable(const char* name)
{
    const char* value = std::getenv(name);
    std::string text = value ? value : "";
    ::unsetenv(name);
    return text;
}

unsigned parse_listen_number(const std::string& text, const char* name)
{
    const std::optional<unsigned> value = whole_number<unsigned>(text);
    if (!value)
        throw Error(fmt::format("{}='{}': expected a whole number", name, text));
    return *value;
}

std::vector<std::string> split_fd_names(const std::string& text)
{
    std::vector<std::string> split;
    size_t start = 0;
    for (;;) {
        const size_t colon = text.find(':', start);
        split.push_back(text.substr(start, colon - start));
        if (colon == std::string::npos)
            return split;
        start = colon + 1;
    }
}

int inherited_socket_option(int fd, int option, const std::string& what)
{
    int value = 0;
    socklen_t length = sizeof value;
    if (::getsockopt(fd, SOL_SOCKET, option, &value, &length) != 0)
        throw_errno(fmt::format("{}: not a socket", what));
    return value;
}

// What the socket is bound to, as --listen would have named it.
ListenSpec describe_inherited(int fd, const std::string& what)
{
    sockaddr_storage bound{};
    socklen_t length = sizeof bound;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0)
        throw_errno(fmt::format("{}: getsockname", what));
    ListenSpec spec;
    spec.inherited_fd = fd;
    char text[INET6_ADDRSTRLEN] = {};
    switch (bound.ss_family) {
    case AF_UNIX: {
        const auto* address = reinterpret_cast<const sockaddr_un*>(&bound);
        const size_t path_length = length > offsetof(sockaddr_un, sun_path) ? length - offsetof(sockaddr_un, sun_path) : 0;
        spec.path = path_length > 0 && address->sun_path[0] == '\0'
                        ? "@" + std::string(address->sun_path + 1, path_length - 1)
                        : std::string(address->sun_path, ::strnlen(address->sun_path, path_length));
        return spec;
    }
    case AF_INET: {
        const auto* address = reinterpret_cast<const sockaddr_in*>(&bound);
        ::inet_ntop(AF_INET, &address->sin_addr, text, sizeof text);
        spec.tcp = true;
        spec.host = text;
        spec.port = ntohs(address->sin_port);
        return spec;
    }
    case AF_INET6: {
        const auto* address = reinterpret_cast<const sockaddr_in6*>(&bound);
        ::inet_ntop(AF_INET6, &address->sin6_addr, text, sizeof text);
        spec.tcp = true;
        spec.host = text;
        spec.port = ntohs(address->sin6_port);
        return spec;
    }
    default:
        throw Error(fmt::format("{}: a socket of address family {}: serve listens on Unix, IPv4 or IPv6 sockets "
                                "only", what, bound.ss_family));
    }
}

} // namespace

std::vector<InheritedSocket> take_inherited_sockets()
{
    const std::string pid = take_listen_variable("LISTEN_PID");
    const std::string count = take_listen_variable("LISTEN_FDS");
    const std::string names = take_listen_variable("LISTEN_FDNAMES");
    if (pid.empty() || parse_listen_number(pid, "LISTEN_PID") != static_cast<unsigned>(::getpid()))
        return {};
    const unsigned n = parse_listen_number(count, "LISTEN_FDS");
    if (n > max_passed_fds)
        throw Error(fmt::format("LISTEN_FDS={}: more than {} sockets", n, max_passed_fds));
    std::vector<std::string> fd_names = names.empty() ? std::vector<std::string>(n) : split_fd_names(names);
    if (fd_names.size() != n)
        throw Error(fmt::format("LISTEN_FDNAMES='{}' names {} sockets, LISTEN_FDS={}", names, fd_names.size(), n));
    std::vector<InheritedSocket> sockets;
    for (unsigned i = 0; i < n; ++i) {
        const int fd = first_passed_fd + static_cast<int>(i);
        const std::string what = fmt::format("the socket systemd passed as descriptor {} ({})", fd,
                                             fd_names[i].empty() ? "unnamed" : fd_names[i]);
        if (inherited_socket_option(fd, SO_TYPE, what) != SOCK_STREAM)
            throw Error(fmt::format("{}: not a stream socket (ListenStream= in the .socket unit)", what));
        if (inherited_socket_option(fd, SO_ACCEPTCONN, what) == 0)
            throw Error(fmt::format("{}: not listening (Accept=yes is not supported: serve accepts its own "
                                    "connections)", what));
        const int flags = ::fcntl(fd, F_GETFL);
        if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0 || ::fcntl(fd, F_SETFD, FD_CLOEXEC) != 0)
            throw_errno(fmt::format("{}: fcntl", what));
        sockets.push_back({fd_names[i], describe_inherited(fd, what)});
    }
    return sockets;
}

} // namespace agentvm
