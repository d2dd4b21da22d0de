#include "cli/port_forward/splice.hpp"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace agentvm {

Splice::Splice(Fd client, Fd guest, std::string early) : client_(std::move(client)), guest_(std::move(guest))
{
    up_.source = down_.destination = "the client";
    up_.destination = down_.source = "the guest";
    // At most what one handshake read (4 KiB) is left over, far under the buffer's size.
    const size_t kept = std::min(early.size(), buffer_size);
    std::memcpy(down_.buffer.get(), early.data(), kept);
    down_.end = kept;
}

short Splice::client_events() const
{
    return static_cast<short>((up_.wants_read() ? POLLIN : 0) | (down_.has_bytes() ? POLLOUT : 0));
}

short Splice::guest_events() const
{
    return static_cast<short>((down_.wants_read() ? POLLIN : 0) | (up_.has_bytes() ? POLLOUT : 0));
}

void Splice::note(const char* doing, const char* whom, int err)
{
    if (problem_.empty())
        problem_ = fmt::format("{} {}: {}", doing, whom, std::strerror(err));
}

void Splice::pump()
{
    // A few rounds, so bytes read can go straight out, but never so many that one busy
    // connection starves the others of the loop.
    for (int round = 0; round < 4; ++round) {
        const bool moved_up = pump(up_, client_.get(), guest_.get(), down_);
        const bool moved_down = pump(down_, guest_.get(), client_.get(), up_);
        if (!moved_up && !moved_down)
            return;
    }
}

bool Splice::pump(Direction& d, int from, int to, Direction& reverse)
{
    bool moved = false;
    auto write_out = [&] {
        while (d.has_bytes()) {
            const ssize_t n = ::send(to, d.buffer.get() + d.begin, d.end - d.begin, MSG_NOSIGNAL);
            if (n < 0) {
                if (errno == EINTR)
                    continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK)
                    return;
                // The destination is gone: what it was sent is lost, and its source is read
                // no more. The other direction goes on, to deliver what the destination had
                // sent before it went.
                note("writing to", d.destination, errno);
                d.failed = true;
                d.begin = d.end = 0;
                return;
            }
            d.begin += static_cast<size_t>(n);
            d.total += static_cast<uint64_t>(n);
            moved = true;
        }
        d.begin = d.end = 0;
    };

    write_out();
    if (d.wants_read()) {
        // Room at the front from a partial write: made usable once the back half is taken.
        if (d.begin > 0 && buffer_size - d.end < buffer_size / 2) {
            std::memmove(d.buffer.get(), d.buffer.get() + d.begin, d.end - d.begin);
            d.end -= d.begin;
            d.begin = 0;
        }
        const ssize_t n = ::recv(from, d.buffer.get() + d.end, buffer_size - d.end, 0);
        if (n > 0) {
            d.end += static_cast<size_t>(n);
            moved = true;
            write_out();
        } else if (n == 0) {
            d.eof = true;
            moved = true;
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            // A reset source: what it sent is delivered, then its peer sees the end; and it
            // cannot take the other direction's bytes any more.
            note("reading from", d.source, errno);
            d.eof = true;
            reverse.failed = true;
            reverse.begin = reverse.end = 0;
            moved = true;
        }
    }
    if (d.eof && !d.failed && !d.shut && d.end == d.begin) {
        // ENOTCONN when the destination has been reset meanwhile: it has ended either way.
        ::shutdown(to, SHUT_WR);
        d.shut = true;
        moved = true;
    }
    return moved;
}

} // namespace agentvm
