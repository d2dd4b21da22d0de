#include "core/async_writer.hpp"

#include <poll.h>
#include <unistd.h>

#include <cerrno>

namespace agentvm {
namespace {

// Offset -1: the file's current position, so a stdout redirected to a regular file is
// appended to like with write(2), while pipes, terminals and sockets ignore it.
constexpr uint64_t current_position = ~uint64_t{0};

} // namespace

AsyncWriter::AsyncWriter(EventLoop& loop, int fd, std::function<void(int err)> on_error)
    : loop_(loop), fd_(fd), on_error_(std::move(on_error))
{
}

void AsyncWriter::write(std::string bytes)
{
    if (failed_ || bytes.empty())
        return;
    queued_bytes_ += bytes.size();
    queue_.push_back(std::move(bytes));
    start_write();
}

void AsyncWriter::when_flushed(std::function<void()> done)
{
    if (queue_.empty() && !writing_) {
        done();
        return;
    }
    on_flushed_ = std::move(done);
}

void AsyncWriter::start_write()
{
    if (writing_ || stopped_ || queue_.empty())
        return;
    const std::string& head = queue_.front();
    iov_ = {const_cast<char*>(head.data()) + head_offset_, head.size() - head_offset_};
    writing_ = true;
    loop_.writev(fd_, &iov_, 1, current_position, [this](int32_t res) {
        writing_ = false;
        if (res == -ECANCELED || res == -EINTR || res == -EAGAIN) {
            start_write();
            return;
        }
        if (res <= 0) {
            failed_ = true;
            queue_.clear();
            queued_bytes_ = 0;
            on_error_(res < 0 ? -res : EPIPE);
            return;
        }
        const auto written = static_cast<size_t>(res);
        head_offset_ += written;
        queued_bytes_ -= written;
        if (head_offset_ == queue_.front().size()) {
            queue_.pop_front();
            head_offset_ = 0;
        }
        if (!queue_.empty()) {
            start_write();
        } else if (on_flushed_) {
            auto done = std::move(on_flushed_);
            on_flushed_ = nullptr;
            done();
        }
    });
}

void AsyncWriter::stop()
{
    stopped_ = true;
    if (writing_)
        loop_.cancel_io(fd_);
}

void AsyncWriter::flush_blocking()
{
    while (!failed_ && !queue_.empty()) {
        const std::string& head = queue_.front();
        const ssize_t n = ::write(fd_, head.data() + head_offset_, head.size() - head_offset_);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            // A non-blocking fd (the reader may have set it): wait for room instead of spinning.
            pollfd p{fd_, POLLOUT, 0};
            ::poll(&p, 1, -1);
            continue;
        }
        if (n <= 0) {
            failed_ = true;
            on_error_(n < 0 ? errno : EPIPE);
            break;
        }
        head_offset_ += static_cast<size_t>(n);
        queued_bytes_ -= static_cast<size_t>(n);
        if (head_offset_ == head.size()) {
            queue_.pop_front();
            head_offset_ = 0;
        }
    }
    queue_.clear();
    queued_bytes_ = 0;
}

} // namespace agentvm
