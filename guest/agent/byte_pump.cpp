#include "guest/agent/byte_pump.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

namespace agentvm {

namespace {

bool is_transient(int err)
{
    return err == EAGAIN || err == EWOULDBLOCK || err == EINTR;
}

// One direction: bytes received from `from`, held until `to` takes them.
class PumpFlow {
public:
    PumpFlow(int from, int to, std::string_view first)
        : from_(from), to_(to), buffer_(std::make_unique_for_overwrite<char[]>(pump_buffer_bytes))
    {
        end_ = std::min(first.size(), pump_buffer_bytes);
        std::memcpy(buffer_.get(), first.data(), end_);
    }

    bool wants_input() const { return !source_ended_ && end_ - start_ < pump_buffer_bytes; }
    bool has_output() const { return end_ > start_; }
    // The source ended, everything it sent went on, and so did its end.
    bool done() const { return passed_on_; }

    // One recv into the free space; 0, or the errno of a failure.
    int receive()
    {
        if (end_ == pump_buffer_bytes) {
            std::memmove(buffer_.get(), buffer_.get() + start_, end_ - start_);
            end_ -= start_;
            start_ = 0;
        }
        const ssize_t n = ::recv(from_, buffer_.get() + end_, pump_buffer_bytes - end_, MSG_DONTWAIT);
        if (n > 0)
            end_ += static_cast<size_t>(n);
        else if (n == 0)
            source_ended_ = true;
        else if (!is_transient(errno))
            return errno;
        return 0;
    }

    // One send of what is held, and the source's end once nothing is; 0, or the errno of a
    // failure.
    int transmit()
    {
        if (has_output()) {
            const ssize_t n = ::send(to_, buffer_.get() + start_, end_ - start_, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (n < 0 && !is_transient(errno))
                return errno;
            if (n > 0)
                start_ += static_cast<size_t>(n);
            if (start_ == end_)
                start_ = end_ = 0;
        }
        if (source_ended_ && !has_output() && !passed_on_) {
            // Fails only for a peer that is gone altogether (ENOTCONN), which shows as an
            // error or an end on its own side.
            ::shutdown(to_, SHUT_WR);
            passed_on_ = true;
        }
        return 0;
    }

private:
    int from_;
    int to_;
    std::unique_ptr<char[]> buffer_;
    size_t start_ = 0;  // buffer_[start_, end_) waits for `to_`
    size_t end_ = 0;
    bool source_ended_ = false;
    bool passed_on_ = false;
};

} // namespace

PumpEnd pump_bytes(int a, int b, std::string_view to_a, std::string_view to_b)
{
    PumpFlow a_to_b(a, b, to_b);
    PumpFlow b_to_a(b, a, to_a);
    const int fds[2] = {a, b};
    PumpFlow* const reading[2] = {&a_to_b, &b_to_a};  // the flow whose source is fds[i]
    PumpFlow* const writing[2] = {&b_to_a, &a_to_b};  // the flow whose destination is fds[i]
    // A socket that reported a hang-up keeps reporting it: once nothing is asked of it, it is
    // left out of the poll, or the loop would spin while the other side is slow.
    bool hung_up[2] = {false, false};

    for (PumpFlow* flow : reading)
        if (const int err = flow->transmit())
            return {false, err, "send"};
    while (!(a_to_b.done() && b_to_a.done())) {
        pollfd polled[2];
        for (int i = 0; i < 2; ++i) {
            const short events = static_cast<short>((reading[i]->wants_input() ? POLLIN : 0)
                                                    | (writing[i]->has_output() ? POLLOUT : 0));
            polled[i] = {(events == 0 && hung_up[i]) ? -1 : fds[i], events, 0};
        }
        if (::poll(polled, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            return {false, errno, "poll"};
        }
        bool received[2] = {false, false};
        for (int i = 0; i < 2; ++i) {
            const short got = polled[i].revents;
            if (got & POLLERR) {
                int err = 0;
                socklen_t size = sizeof(err);
                if (::getsockopt(fds[i], SOL_SOCKET, SO_ERROR, &err, &size) == 0 && err != 0)
                    return {false, err, "poll"};
            }
            if ((got & (POLLHUP | POLLERR)) && !(polled[i].events & POLLIN))
                hung_up[i] = true;
            if ((got & (POLLIN | POLLHUP | POLLERR)) && (polled[i].events & POLLIN)) {
                if (const int err = reading[i]->receive())
                    return {false, err, "recv"};
                received[i] = true;
            }
        }
        // A flow sends what it just received at once, before waiting for POLLOUT.
        for (int i = 0; i < 2; ++i) {
            if (received[i] || polled[1 - i].revents != 0)
                if (const int err = reading[i]->transmit())
                    return {false, err, "send"};
        }
    }
    return {};
}

} // namespace agentvm
