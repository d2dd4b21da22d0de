#include "service/egress/egress_connection.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace agentvm {

namespace {

// A non-blocking TCP socket connecting to address:port, or an invalid Fd with errno set.
Fd start_connect(const IpAddress& address, uint16_t port)
{
    sockaddr_storage storage{};
    socklen_t size = 0;
    if (address.is_v4()) {
        auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
        v4->sin_family = AF_INET;
        v4->sin_port = htons(port);
        std::memcpy(&v4->sin_addr, address.bytes().data(), 4);
        size = sizeof(sockaddr_in);
    } else {
        auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons(port);
        std::memcpy(&v6->sin6_addr, address.bytes().data(), 16);
        size = sizeof(sockaddr_in6);
    }
    Fd socket(::socket(storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!socket)
        return socket;
    const int one = 1;
    ::setsockopt(socket.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (::connect(socket.get(), reinterpret_cast<const sockaddr*>(&storage), size) != 0 && errno != EINPROGRESS)
        return Fd();
    return socket;
}

std::string address_text(const IpAddress& address, uint16_t port)
{
    return address.is_v4() ? fmt::format("{}:{}", address.text(), port) : fmt::format("[{}]:{}", address.text(), port);
}

} // namespace

std::shared_ptr<EgressConnection> EgressConnection::start(Context& context, Fd sandbox_side)
{
    std::shared_ptr<EgressConnection> connection(new EgressConnection(context, std::move(sandbox_side)));
    connection->begin();
    return connection;
}

std::shared_ptr<EgressConnection> EgressConnection::refuse_at_once(Context& context, Fd sandbox_side,
                                                                   ProxyRefusalStatus status, const std::string& reason)
{
    std::shared_ptr<EgressConnection> connection(new EgressConnection(context, std::move(sandbox_side)));
    std::weak_ptr<EgressConnection> self = connection;
    context.poller.add(connection->sandbox_.get(), [self](uint32_t) {
        if (auto refused = self.lock())
            refused->on_sandbox_ready();
    });
    connection->refuse(status, reason);
    return connection;
}

EgressConnection::EgressConnection(Context& context, Fd sandbox_side)
    : context_(context), sandbox_(std::move(sandbox_side)), timer_(context.loop, [this] { on_timer(); })
{
}

EgressConnection::~EgressConnection()
{
    if (!tunnel_ && sandbox_)
        context_.poller.remove(sandbox_.get());
    if (upstream_)
        context_.poller.remove(upstream_.get());
}

void EgressConnection::begin()
{
    timer_.arm(head_timeout);
    std::weak_ptr<EgressConnection> self = weak_from_this();
    context_.poller.add(sandbox_.get(), [self](uint32_t) {
        if (auto connection = self.lock())
            connection->on_sandbox_ready();
    });
    on_sandbox_ready();
}

void EgressConnection::on_sandbox_ready()
{
    const auto keep = shared_from_this();
    char buffer[16 * 1024];
    while (phase_ == Phase::reading || phase_ == Phase::refusing) {
        const ssize_t got = ::recv(sandbox_.get(), buffer, sizeof buffer, MSG_DONTWAIT);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (phase_ == Phase::refusing) {
            if (got <= 0)
                return finish();  // the tool has read the answer and gone, or reset
            continue;              // what it still sends is dropped
        }
        std::optional<ProxyReading> reading =
            reader_.feed(got > 0 ? std::string_view(buffer, static_cast<size_t>(got)) : std::string_view());
        if (got < 0 && !reading)
            reading = ProxyRefusal{std::strerror(errno), true};
        if (!reading)
            continue;
        if (auto* refusal = std::get_if<ProxyRefusal>(&*reading)) {
            outcome_.reason = refusal->reason;
            if (refusal->ended)
                return finish();
            return refuse(ProxyRefusalStatus::bad_request, refusal->reason);
        }
        return on_request(std::move(std::get<ProxyRequest>(*reading)));
    }
    // Tunnel and connecting phases: readiness is the tunnel's, or waits for it.
}

void EgressConnection::on_request(ProxyRequest request)
{
    request_ = std::move(request);
    outcome_.method = request_.method;
    outcome_.destination = request_.destination.where();
    history_ = context_.on_request(request_);
    // Nothing more is read from the tool until the tunnel opens: what it sends meanwhile (a
    // body, a TLS hello) waits in the socket, and the poller's edge-triggered readiness is
    // not lost, since the tunnel reads until EAGAIN first thing.
    const EgressPolicy& policy = context_.policy();
    const EgressDecision decision = policy.check_name(request_.destination.host, request_.destination.port);
    if (!decision)
        return refuse(ProxyRefusalStatus::forbidden, decision.reason);
    if (!context_.spend(0))
        return refuse(ProxyRefusalStatus::too_many_requests, "the sandbox has used its egress byte budget");
    if (request_.destination.address) {
        Resolution literal;
        literal.addresses.push_back(*request_.destination.address);
        return on_resolved(std::move(literal));
    }
    phase_ = Phase::resolving;
    timer_.arm(resolve_timeout);
    std::weak_ptr<EgressConnection> self = weak_from_this();
    context_.resolver.resolve(request_.destination.host, [self](Resolution resolution) {
        if (auto connection = self.lock(); connection && connection->phase_ == Phase::resolving)
            connection->on_resolved(std::move(resolution));
    });
}

void EgressConnection::on_resolved(Resolution resolution)
{
    if (resolution.addresses.empty())
        return refuse(ProxyRefusalStatus::bad_gateway,
                      fmt::format("{}: the name does not resolve: {}", outcome_.destination, resolution.error));
    // Every address is judged alone, and only those that pass are connected to: the address
    // judged is the address used, whatever the name resolves to next time.
    const EgressPolicy& policy = context_.policy();
    std::string first_refusal;
    for (const IpAddress& address : resolution.addresses) {
        const EgressDecision decision =
            policy.check_address(request_.destination.host, request_.destination.port, address);
        if (decision)
            candidates_.push_back(address);
        else if (first_refusal.empty())
            first_refusal = decision.reason;
    }
    if (candidates_.empty())
        return refuse(ProxyRefusalStatus::forbidden, first_refusal);
    phase_ = Phase::connecting;
    connect_next();
}

void EgressConnection::connect_next()
{
    if (upstream_) {
        context_.poller.remove(upstream_.get());
        upstream_.reset();
    }
    while (!candidates_.empty()) {
        const IpAddress address = candidates_.front();
        candidates_.erase(candidates_.begin());
        outcome_.address = address_text(address, request_.destination.port);
        upstream_ = start_connect(address, request_.destination.port);
        if (!upstream_) {
            last_failure_ = fmt::format("{}: {}", outcome_.address, std::strerror(errno));
            continue;
        }
        timer_.arm(connect_timeout);
        std::weak_ptr<EgressConnection> self = weak_from_this();
        context_.poller.add(upstream_.get(), [self](uint32_t) {
            if (auto connection = self.lock(); connection && connection->phase_ == Phase::connecting)
                connection->on_upstream_ready();
        });
        return;
    }
    refuse(ProxyRefusalStatus::bad_gateway, fmt::format("{}: cannot connect: {}", outcome_.destination, last_failure_));
}

void EgressConnection::on_upstream_ready()
{
    int err = 0;
    socklen_t size = sizeof(err);
    if (::getsockopt(upstream_.get(), SOL_SOCKET, SO_ERROR, &err, &size) != 0)
        err = errno;
    if (err == 0) {
        // Readiness can come before the connection completes only with an error; a socket
        // still connecting reports nothing, so this is the connection made.
        sockaddr_storage peer{};
        socklen_t peer_size = sizeof(peer);
        if (::getpeername(upstream_.get(), reinterpret_cast<sockaddr*>(&peer), &peer_size) == 0)
            return open_tunnel();
        err = errno;
    }
    last_failure_ = fmt::format("{}: {}", outcome_.address, std::strerror(err));
    connect_next();
}

void EgressConnection::open_tunnel()
{
    timer_.cancel();
    phase_ = Phase::tunnel;
    outcome_.allowed = true;
    outcome_.reason = "connected";
    context_.poller.remove(sandbox_.get());
    context_.poller.remove(upstream_.get());
    const bool tunnel = request_.kind == ProxyRequest::Kind::tunnel;
    std::string to_upstream = tunnel ? std::move(request_.early) : request_.upstream_head + request_.early;
    std::string to_sandbox = tunnel ? proxy_established_answer() : std::string();
    auto sandbox = std::make_shared<Fd>(std::move(sandbox_));
    const int sandbox_fd = sandbox->get();
    std::weak_ptr<EgressConnection> self = weak_from_this();
    tunnel_ = ByteTunnel::join(
        context_.poller, ByteTunnel::BorrowedSocket{sandbox_fd, [sandbox] { sandbox->reset(); }},
        std::move(to_upstream), std::move(upstream_), std::move(to_sandbox), [self] {
            if (auto connection = self.lock())
                connection->finish();
        });
    if (tunnel_ && phase_ == Phase::tunnel)
        tunnel_->watch_bytes(context_.spend);
}

void EgressConnection::refuse(ProxyRefusalStatus status, const std::string& reason)
{
    outcome_.refusal = status;
    outcome_.reason = reason;
    if (upstream_) {
        context_.poller.remove(upstream_.get());
        upstream_.reset();
    }
    phase_ = Phase::refusing;
    const std::string answer = proxy_refusal_answer(status, reason);
    // A few hundred bytes on a socket whose send buffer is empty: sent whole, at once.
    [[maybe_unused]] const ssize_t sent =
        ::send(sandbox_.get(), answer.data(), answer.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::shutdown(sandbox_.get(), SHUT_WR);
    timer_.arm(refusal_linger);
    on_sandbox_ready();
}

void EgressConnection::on_timer()
{
    const auto keep = shared_from_this();
    switch (phase_) {
    case Phase::reading:
        outcome_.reason = fmt::format("no whole request within {} s", head_timeout.count());
        return refuse(ProxyRefusalStatus::bad_request, outcome_.reason);
    case Phase::resolving:
        return refuse(ProxyRefusalStatus::gateway_timeout,
                      fmt::format("{}: the name did not resolve within {} s", outcome_.destination,
                                  resolve_timeout.count()));
    case Phase::connecting:
        last_failure_ = fmt::format("{}: no answer within {} s", outcome_.address, connect_timeout.count());
        if (candidates_.empty())
            return refuse(ProxyRefusalStatus::gateway_timeout,
                          fmt::format("{}: cannot connect: {}", outcome_.destination, last_failure_));
        return connect_next();
    case Phase::refusing:
        return finish();
    case Phase::tunnel:
    case Phase::closed:
        return;
    }
}

void EgressConnection::close(const std::string& why)
{
    if (phase_ == Phase::closed)
        return;
    if (outcome_.reason.empty() || outcome_.allowed)
        outcome_.reason = why;
    if (tunnel_)
        tunnel_->close();  // calls finish()
    finish();
}

void EgressConnection::finish()
{
    if (ended_)
        return;
    ended_ = true;
    const auto keep = shared_from_this();
    phase_ = Phase::closed;
    timer_.cancel();
    if (tunnel_) {
        outcome_.bytes_out = tunnel_->bytes_to_guest();
        outcome_.bytes_in = tunnel_->bytes_to_client();
    }
    if (sandbox_) {
        context_.poller.remove(sandbox_.get());
        sandbox_.reset();
    }
    if (upstream_) {
        context_.poller.remove(upstream_.get());
        upstream_.reset();
    }
    outcome_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    context_.on_end(*this, history_, outcome_);
}

} // namespace agentvm
