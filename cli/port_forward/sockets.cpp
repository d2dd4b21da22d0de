#include "cli/port_forward/sockets.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"

namespace agentvm {
namespace {

std::string address_text(const sockaddr* address)
{
    char host[INET6_ADDRSTRLEN] = {};
    if (address->sa_family == AF_INET) {
        const auto* in = reinterpret_cast<const sockaddr_in*>(address);
        ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        return fmt::format("{}:{}", host, ntohs(in->sin_port));
    }
    if (address->sa_family == AF_INET6) {
        const auto* in6 = reinterpret_cast<const sockaddr_in6*>(address);
        ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        return fmt::format("[{}]:{}", host, ntohs(in6->sin6_port));
    }
    return {};
}

SocketAddress unix_address(const std::string& path)
{
    SocketAddress address;
    auto* un = reinterpret_cast<sockaddr_un*>(&address.storage);
    un->sun_family = AF_UNIX;
    // address.cpp has checked that the path fits with its NUL.
    std::memcpy(un->sun_path, path.c_str(), path.size() + 1);
    address.length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
    address.text = "unix:" + path;
    return address;
}

Fd new_socket(int family)
{
    Fd fd(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd)
        throw_errno("socket");
    return fd;
}

// A Unix socket file left by an earlier run that is gone (nothing accepts on it) is taken
// over; anything else at the path is an error.
void clear_stale_unix_socket(const std::string& path)
{
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
        if (errno == ENOENT)
            return;
        throw_errno(fmt::format("--listen unix:{}", path));
    }
    if (!S_ISSOCK(st.st_mode))
        throw Error(fmt::format("--listen unix:{}: the path exists and is not a socket", path));
    Fd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!probe)
        throw_errno("socket");
    const SocketAddress address = unix_address(path);
    if (::connect(probe.get(), address.get(), address.length) == 0)
        throw Error(fmt::format("--listen unix:{}: another process listens on it", path));
    if (errno != ECONNREFUSED)
        throw_errno(fmt::format("--listen unix:{}: checking the socket already there", path));
    spdlog::info("removing the stale socket {} (nothing listens on it)", path);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
        throw_errno(fmt::format("--listen unix:{}: removing the stale socket", path));
}

} // namespace

std::vector<SocketAddress> resolve(const Endpoint& endpoint, bool passive)
{
    if (endpoint.unix_socket)
        return {unix_address(endpoint.path)};
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
    addrinfo* found = nullptr;
    const std::string port = std::to_string(endpoint.port);
    if (const int err = ::getaddrinfo(endpoint.host.c_str(), port.c_str(), &hints, &found); err != 0)
        throw Error(fmt::format("cannot resolve '{}': {}", endpoint.host,
                                err == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(err)));
    std::vector<SocketAddress> addresses;
    for (const addrinfo* info = found; info; info = info->ai_next) {
        if (info->ai_family != AF_INET && info->ai_family != AF_INET6)
            continue;
        SocketAddress address;
        std::memcpy(&address.storage, info->ai_addr, info->ai_addrlen);
        address.length = info->ai_addrlen;
        address.text = address_text(info->ai_addr);
        addresses.push_back(std::move(address));
    }
    ::freeaddrinfo(found);
    if (addresses.empty())
        throw Error(fmt::format("'{}' has no IPv4 or IPv6 address", endpoint.host));
    return addresses;
}

std::string peer_text(int fd)
{
    sockaddr_storage storage{};
    socklen_t length = sizeof(storage);
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&storage), &length) != 0)
        return {};
    const std::string text = address_text(reinterpret_cast<const sockaddr*>(&storage));
    return text.empty() ? "a local process" : text;
}

Listener::Listener(const Endpoint& endpoint)
{
    if (endpoint.unix_socket) {
        clear_stale_unix_socket(endpoint.path);
        const SocketAddress address = unix_address(endpoint.path);
        fd_ = new_socket(AF_UNIX);
        if (::bind(fd_.get(), address.get(), address.length) != 0)
            throw_errno(fmt::format("--listen {}: bind", address.text));
        // Before listen(): until then nobody can connect, whatever the umask made of the mode.
        // A failure leaves no file behind (the destructor does not run for a constructor that throws).
        if (::chmod(endpoint.path.c_str(), 0600) != 0 || ::listen(fd_.get(), SOMAXCONN) != 0) {
            const int err = errno;
            ::unlink(endpoint.path.c_str());
            throw_errno(fmt::format("--listen {}", address.text), err);
        }
        unix_path_ = endpoint.path;
        struct stat st {};
        if (::stat(unix_path_.c_str(), &st) == 0) {
            unix_dev_ = st.st_dev;
            unix_ino_ = st.st_ino;
        }
        text_ = address.text;
        return;
    }
    int last_err = 0;
    std::string last_address;
    std::vector<SocketAddress> addresses;
    try {
        addresses = resolve(endpoint, true);
    } catch (const Error& e) {
        throw Error(fmt::format("--listen {}: {}", endpoint.text(), e.what()));
    }
    for (const SocketAddress& address : addresses) {
        Fd fd = new_socket(address.storage.ss_family);
        const int one = 1;
        ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (::bind(fd.get(), address.get(), address.length) != 0 || ::listen(fd.get(), SOMAXCONN) != 0) {
            last_err = errno;
            last_address = address.text;
            continue;
        }
        sockaddr_storage bound{};
        socklen_t length = sizeof(bound);
        if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &length) != 0)
            throw_errno("getsockname");
        fd_ = std::move(fd);
        text_ = address_text(reinterpret_cast<const sockaddr*>(&bound));
        return;
    }
    throw_errno(fmt::format("--listen {}: cannot listen on {}", endpoint.text(), last_address), last_err);
}

Listener::~Listener()
{
    if (unix_path_.empty())
        return;
    // Only the file this listener made: another process may have replaced it since.
    struct stat st {};
    if (::lstat(unix_path_.c_str(), &st) == 0 && st.st_dev == unix_dev_ && st.st_ino == unix_ino_)
        ::unlink(unix_path_.c_str());
}

Fd start_connect(const SocketAddress& address, bool* in_progress, int* err)
{
    *in_progress = false;
    Fd fd(::socket(address.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd) {
        *err = errno;
        return {};
    }
    if (::connect(fd.get(), address.get(), address.length) == 0)
        return fd;
    // A Unix socket whose backlog is full answers EAGAIN, and polling would not say when it
    // has room: that is a failure here, as a refused connect is.
    if (errno == EINPROGRESS) {
        *in_progress = true;
        return fd;
    }
    *err = errno;
    return {};
}

} // namespace agentvm
