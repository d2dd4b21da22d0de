#include "service/ports/port_http_relay.hpp"

#include <sys/socket.h>

#include <cerrno>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace agentvm {

namespace {

// The request bytes held for the guest before the client's body is paused, and the answer
// bytes held for the client before the guest is no longer read (and where reading resumes).
constexpr size_t to_guest_high_water = 1024 * 1024;
constexpr size_t to_client_high_water = 1024 * 1024;
constexpr size_t to_client_low_water = 256 * 1024;
// What one turn of the loop reads from one guest connection before letting others run.
constexpr size_t read_budget = 4 * 1024 * 1024;

} // namespace

std::shared_ptr<PortHttpRelay> PortHttpRelay::start(EventLoop& loop, SocketPoller& poller,
                                                    std::shared_ptr<HttpExchange> exchange, Target target,
                                                    std::function<void()> on_done)
{
    std::shared_ptr<PortHttpRelay> relay(
        new PortHttpRelay(poller, std::move(exchange), std::move(target), std::move(on_done)));
    relay->begin(loop);
    return relay;
}

PortHttpRelay::PortHttpRelay(SocketPoller& poller, std::shared_ptr<HttpExchange> exchange, Target target,
                             std::function<void()> on_done)
    : poller_(poller), exchange_(std::move(exchange)), target_(std::move(target)), on_done_(std::move(on_done))
{
}

PortHttpRelay::~PortHttpRelay()
{
    if (guest_)
        poller_.remove(guest_.get());
}

void PortHttpRelay::begin(EventLoop& loop)
{
    head_ = guest_request_head(exchange_->method(), target_.path_and_query, exchange_->headers(), target_.strip);
    std::weak_ptr<PortHttpRelay> self = weak_from_this();
    exchange_->read_body(
        [self](std::string_view piece) {
            auto relay = self.lock();
            if (!relay || relay->finished_ || relay->upgrading_)
                return;
            if (relay->head_.framing == BodyFraming::chunked)
                relay->to_guest_ += fmt::format("{:x}\r\n{}\r\n", piece.size(), piece);
            else
                relay->to_guest_.append(piece);
            relay->send_pending();
        },
        [self] {
            auto relay = self.lock();
            if (!relay || relay->finished_)
                return;
            relay->body_ended_ = true;
            if (relay->head_.framing == BodyFraming::chunked)
                relay->to_guest_ += "0\r\n\r\n";
            relay->send_pending();
        });
    // Nothing of the body is taken before the guest's server has answered the connection.
    exchange_->pause_body();
    exchange_->on_gone([self] {
        if (auto relay = self.lock())
            relay->close();
    });
    exchange_->watch_client();
    dialer_ = GuestPortDialer::dial(loop, poller_, target_.vsock_path, target_.port,
                                    {[self](DialedPort dialed) {
                                         if (auto relay = self.lock())
                                             relay->opened(std::move(dialed));
                                     },
                                     [self](const std::string& why, bool) {
                                         if (auto relay = self.lock())
                                             relay->failed(why);
                                     }});
}

void PortHttpRelay::failed(const std::string& why)
{
    exchange_->refuse(ServiceError::port_unreachable, fmt::format("sandbox {}: {}", target_.sandbox_id, why));
    done();
}

void PortHttpRelay::opened(DialedPort dialed)
{
    dialer_.reset();
    guest_ = std::move(dialed.socket);
    to_guest_.insert(0, head_.text);
    answer_.emplace(exchange_->method() == "HEAD",
                    GuestHttpResponse::Handlers{[this](const GuestHttpResponse::Head& head) { on_head(head); },
                                                [this](std::string_view bytes) { exchange_->write(bytes); },
                                                [this] {
                                                    if (!upgrading_)
                                                        exchange_->finish();
                                                }});
    std::weak_ptr<PortHttpRelay> self = weak_from_this();
    poller_.add(guest_.get(), [self](uint32_t) {
        if (auto relay = self.lock())
            relay->on_ready();
    });
    if (!dialed.early.empty()) {
        if (const auto error = answer_->feed(dialed.early))
            return answer_failed(fmt::format("guest port {}: {}", target_.port, *error));
        if (upgrading_) {
            from_guest_ = answer_->take_upgraded();
            return;
        }
        if (answer_->ended())
            return done();
    }
    exchange_->resume_body();
    on_ready();
}

void PortHttpRelay::on_ready()
{
    if (finished_ || upgrading_)
        return;
    const auto keep = shared_from_this();
    send_pending();
    if (!finished_)
        read_answer();
}

void PortHttpRelay::send_pending()
{
    if (!guest_ || finished_)
        return;
    while (!to_guest_.empty()) {
        const ssize_t sent = ::send(guest_.get(), to_guest_.data(), to_guest_.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0 && errno == EINTR)
            continue;
        if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (sent <= 0) {
            // The server stopped reading the request (it may have answered already, an early
            // 413): the rest of the body is dropped, and the answer is still read.
            to_guest_.clear();
            body_ended_ = true;
            break;
        }
        to_guest_.erase(0, static_cast<size_t>(sent));
    }
    const bool full = to_guest_.size() > to_guest_high_water;
    if (full && !body_paused_) {
        body_paused_ = true;
        exchange_->pause_body();
    } else if (!full && body_paused_) {
        body_paused_ = false;
        exchange_->resume_body();
    }
}

void PortHttpRelay::read_answer()
{
    if (answer_paused_ || !answer_)
        return;
    char buffer[64 * 1024];
    size_t read = 0;
    while (!finished_ && !upgrading_) {
        if (read >= read_budget)
            return poller_.again(guest_.get());
        const ssize_t got = ::recv(guest_.get(), buffer, sizeof buffer, MSG_DONTWAIT);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (got < 0)
            return answer_failed(fmt::format("guest port {}: the connection failed ({})", target_.port,
                                             std::strerror(errno)));
        read += static_cast<size_t>(got);
        if (const auto error = answer_->feed(std::string_view(buffer, static_cast<size_t>(got))))
            return answer_failed(fmt::format("guest port {}: {}", target_.port, *error));
        if (upgrading_) {
            from_guest_ = answer_->take_upgraded();
            return;
        }
        if (answer_->ended())
            return done();
        if (exchange_->buffered() > to_client_high_water) {
            answer_paused_ = true;
            std::weak_ptr<PortHttpRelay> self = weak_from_this();
            exchange_->on_drained(to_client_low_water, [self] {
                if (auto relay = self.lock(); relay && !relay->finished_) {
                    relay->answer_paused_ = false;
                    relay->poller_.again(relay->guest_.get());
                }
            });
            return;
        }
    }
}

void PortHttpRelay::on_head(const GuestHttpResponse::Head& head)
{
    for (const auto& [name, value] : head.headers)
        exchange_->add_header(name, value);
    // A HEAD's answer without a length is answered whole and empty: MHD 0.9.75 would end a
    // chunked one with a last chunk, bytes a HEAD's answer must not have.
    if (!head.upgrade && exchange_->method() == "HEAD" && !head.content_length)
        return exchange_->respond(head.status, "", head.content_type.c_str());
    if (!head.upgrade)
        return exchange_->start_stream(head.status, head.content_type.c_str(), head.content_length);
    if (!head_.upgrade)
        return answer_failed(fmt::format("guest port {}: the server switched protocols unasked", target_.port));
    upgrading_ = true;
    std::weak_ptr<PortHttpRelay> self = weak_from_this();
    exchange_->upgrade([self](HttpExchange::UpgradedSocket client) -> std::function<void()> {
        auto relay = self.lock();
        if (!relay || relay->finished_)
            return nullptr;
        return relay->upgraded(std::move(client));
    });
}

std::function<void()> PortHttpRelay::upgraded(HttpExchange::UpgradedSocket client)
{
    poller_.remove(guest_.get());
    std::string to_guest = std::move(to_guest_);
    to_guest += client.early;
    std::weak_ptr<PortHttpRelay> self = weak_from_this();
    tunnel_ = ByteTunnel::join(poller_, {client.fd, std::move(client.close)}, std::move(to_guest), std::move(guest_),
                               std::move(from_guest_), [self] {
                                   if (auto relay = self.lock())
                                       relay->done();
                               });
    std::weak_ptr<ByteTunnel> tunnel = tunnel_;
    return [tunnel] {
        if (auto open = tunnel.lock())
            open->close();
    };
}

void PortHttpRelay::answer_failed(const std::string& why)
{
    if (finished_)
        return;
    spdlog::debug("sandbox {}: {}", target_.sandbox_id, why);
    if (answer_ && answer_->head_seen())
        exchange_->abort();
    else
        exchange_->refuse(ServiceError::port_unreachable, fmt::format("sandbox {}: {}", target_.sandbox_id, why));
    done();
}

void PortHttpRelay::close()
{
    if (finished_)
        return;
    if (tunnel_)
        return tunnel_->close();  // its on_closed ends the relay
    if (!exchange_->answered())
        exchange_->refuse(ServiceError::shutting_down, "the connection to the guest's port was closed");
    else
        exchange_->abort();
    done();
}

void PortHttpRelay::done()
{
    if (finished_)
        return;
    finished_ = true;
    if (dialer_) {
        dialer_->cancel();
        dialer_.reset();
    }
    if (guest_) {
        poller_.remove(guest_.get());
        guest_.reset();
    }
    if (auto on_done = std::exchange(on_done_, nullptr))
        on_done();
}

} // namespace agentvm
