#include "service/egress/egress_proxy.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "protocol/vsock_ports.hpp"

namespace agentvm {

std::map<std::string, std::string> egress_proxy_env()
{
    const std::string proxy = fmt::format("http://127.0.0.1:{}", egress_proxy_tcp_port);
    const std::string local = "localhost,127.0.0.1,::1";
    return {{"HTTP_PROXY", proxy}, {"HTTPS_PROXY", proxy}, {"http_proxy", proxy}, {"https_proxy", proxy},
            {"NO_PROXY", local},   {"no_proxy", local}};
}

std::string EgressProxy::socket_for(const std::string& vsock_uds)
{
    return fmt::format("{}_{}", vsock_uds, egress_vsock_port);
}

EgressProxy::EgressProxy(EventLoop& loop, SocketPoller& poller, NameResolver& resolver, EgressPolicy policy,
                         EgressLimits limits, std::string socket_path, Hooks hooks)
    : poller_(poller),
      policy_(std::move(policy)),
      limits_(limits),
      socket_path_(std::move(socket_path)),
      hooks_(std::move(hooks)),
      context_{loop, poller, resolver, [this]() -> const EgressPolicy& { return policy_; },
               [this](uint64_t bytes) { return spend(bytes); }, hooks_.on_request, nullptr}
{
    context_.on_end = [this](EgressConnection& connection, std::optional<uint64_t> history,
                             const EgressOutcome& outcome) {
        connections_.erase(&connection);
        refused_.erase(&connection);
        hooks_.on_end(history, outcome);
    };
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    if (socket_path_.size() >= sizeof(address.sun_path))
        throw Error(fmt::format("egress: socket path '{}' is too long for a Unix socket", socket_path_));
    std::memcpy(address.sun_path, socket_path_.c_str(), socket_path_.size() + 1);
    listener_ = Fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!listener_)
        throw_errno("egress: socket");
    if (::bind(listener_.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0)
        throw_errno(fmt::format("egress: bind {}", socket_path_));
    if (::listen(listener_.get(), 128) != 0) {
        ::unlink(socket_path_.c_str());
        throw_errno(fmt::format("egress: listen {}", socket_path_));
    }
    poller_.add(listener_.get(), [this](uint32_t) { accept_all(); });
}

EgressProxy::~EgressProxy()
{
    closing_ = true;
    poller_.remove(listener_.get());
    ::unlink(socket_path_.c_str());
    // close() ends each in on_end; the map is moved out first since finishing erases.
    for (auto* list : {&connections_, &refused_}) {
        auto open = std::move(*list);
        for (auto& [raw, connection] : open)
            connection->close("the sandbox ended");
    }
}

void EgressProxy::accept_all()
{
    for (;;) {
        Fd socket(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (!socket) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                spdlog::warn("egress: accept on {}: {}", socket_path_, std::strerror(errno));
            return;
        }
        if (connections_.size() >= limits_.max_connections) {
            auto refused = EgressConnection::refuse_at_once(
                context_, std::move(socket), ProxyRefusalStatus::too_many_requests,
                fmt::format("the sandbox has {} connections out open, as many as it may", limits_.max_connections));
            if (!refused->closed())
                refused_[refused.get()] = refused;
            continue;
        }
        auto connection = EgressConnection::start(context_, std::move(socket));
        if (!connection->closed())
            connections_[connection.get()] = connection;
    }
}

bool EgressProxy::spend(uint64_t bytes)
{
    bytes_used_ += bytes;
    return bytes_used_ < limits_.max_bytes;
}

} // namespace agentvm
