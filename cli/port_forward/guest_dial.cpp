#include "cli/port_forward/guest_dial.hpp"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace agentvm {

GuestDial::GuestDial(const GuestRoute& route) : route_(route)
{
    connect_next();
}

void GuestDial::fail(std::string why)
{
    state_ = State::failed;
    failure_ = std::move(why);
    fd_.reset();
}

// The next address, after the last one's connect failed: a name like localhost resolves to
// ::1 and 127.0.0.1, and serve may listen on one of them only.
void GuestDial::connect_next()
{
    while (next_address_ < route_.addresses.size()) {
        const SocketAddress& address = route_.addresses[next_address_++];
        bool in_progress = false;
        int err = 0;
        fd_ = start_connect(address, &in_progress, &err);
        if (fd_) {
            if (in_progress) {
                state_ = State::connecting;
                return;
            }
            start_handshake();
            return;
        }
        connect_errors_ += fmt::format("{}connecting to {}: {}", connect_errors_.empty() ? "" : "; ", address.text,
                                       std::strerror(err));
    }
    fail(connect_errors_.empty() ? std::string("no address to connect to") : connect_errors_);
}

void GuestDial::start_handshake()
{
    state_ = State::handshaking;
    handshake_ = route_.handshake();
    pending_ = handshake_->opening();
    write_pending();
}

short GuestDial::events() const
{
    switch (state_) {
    case State::connecting:
        return POLLOUT;
    case State::handshaking:
        return pending_.empty() ? POLLIN : POLLOUT;
    case State::done:
    case State::failed:
        break;
    }
    return 0;
}

void GuestDial::on_ready(short revents)
{
    if (revents == 0)
        return;
    if (state_ == State::connecting) {
        int err = 0;
        socklen_t length = sizeof(err);
        if (::getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &length) != 0)
            err = errno;
        if (err == 0) {
            start_handshake();
            return;
        }
        const SocketAddress& address = route_.addresses[next_address_ - 1];
        connect_errors_ += fmt::format("{}connecting to {}: {}", connect_errors_.empty() ? "" : "; ", address.text,
                                       std::strerror(err));
        fd_.reset();
        connect_next();
        return;
    }
    if (state_ != State::handshaking)
        return;
    if (!pending_.empty())
        write_pending();
    else
        read_answer();
}

void GuestDial::write_pending()
{
    while (!pending_.empty()) {
        const ssize_t n = ::send(fd_.get(), pending_.data(), pending_.size(), MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            if (errno == EINTR)
                continue;
            // The far end may have answered (a refusal) and closed before reading it all.
            const int err = errno;
            if (err == EPIPE || err == ECONNRESET) {
                pending_.clear();
                read_answer();
                if (state_ == State::handshaking)
                    fail(fmt::format("writing to {}: {}", route_.addresses[next_address_ - 1].text,
                                     std::strerror(err)));
                return;
            }
            fail(fmt::format("writing to {}: {}", route_.addresses[next_address_ - 1].text, std::strerror(err)));
            return;
        }
        pending_.erase(0, static_cast<size_t>(n));
    }
}

void GuestDial::read_answer()
{
    char buffer[4096];
    bool eof = false;
    const ssize_t n = ::recv(fd_.get(), buffer, sizeof(buffer), 0);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return;
        // A reset after an answer that has been read in full is still that answer.
        if (received_.empty()) {
            fail(fmt::format("reading from {}: {}", route_.addresses[next_address_ - 1].text, std::strerror(errno)));
            return;
        }
        eof = true;
    } else if (n == 0) {
        eof = true;
    } else {
        received_.append(buffer, static_cast<size_t>(n));
    }
    for (;;) {
        HandshakeStep step = handshake_->advance(received_, eof);
        switch (step.kind) {
        case HandshakeStep::Kind::need_more:
            if (eof)
                fail(fmt::format("{} closed the connection in the middle of the handshake",
                                 route_.addresses[next_address_ - 1].text));
            return;
        case HandshakeStep::Kind::send:
            pending_ += step.text;
            write_pending();
            if (state_ != State::handshaking || !pending_.empty() || (received_.empty() && !eof))
                return;
            continue;  // the answer to what was just sent may have come already
        case HandshakeStep::Kind::done:
            state_ = State::done;
            return;
        case HandshakeStep::Kind::refused:
            fail(std::move(step.text));
            return;
        }
    }
}

void GuestDial::time_out(std::chrono::milliseconds after)
{
    const std::string where = next_address_ > 0 ? route_.addresses[next_address_ - 1].text : std::string("the far end");
    const double seconds = std::chrono::duration<double>(after).count();
    fail(state_ == State::connecting ? fmt::format("connecting to {}: no connection within {} s", where, seconds)
                                     : fmt::format("{} did not finish the handshake within {} s", where, seconds));
}

} // namespace agentvm
