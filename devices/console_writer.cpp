#include "devices/console_writer.hpp"

#include <limits.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "devices/serial.hpp"

namespace agentvm {
namespace {

// Offset -1: the file's current position, so a console file is appended to like with
// write(2), while pipes, terminals and sockets ignore it.
constexpr uint64_t current_position = ~uint64_t{0};

// One warning per burst of loss, and no more often than this.
constexpr auto report_interval = std::chrono::seconds(10);

// How long finish() lets the fd take each piece of what is left: enough for a reader that is
// reading, short of holding up a VM that is being stopped.
constexpr int finish_patience_ms = 100;

} // namespace

ConsoleWriter::ConsoleWriter(EventLoop& loop, SerialDevice& serial, int fd)
    : loop_(loop), serial_(serial), fd_(fd), wake_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK))
{
    if (!wake_fd_)
        throw_errno("eventfd for the serial console");
    loop_.watch_readable(wake_fd_.get(), [this] {
        uint64_t count = 0;
        [[maybe_unused]] ssize_t n = ::read(wake_fd_.get(), &count, sizeof count);
        report_drops();
        pump();
    });
    serial_.set_output_ready([this] { wake(); });
}

ConsoleWriter::~ConsoleWriter()
{
    serial_.set_output_ready(nullptr);
    loop_.unwatch(wake_fd_.get());
}

void ConsoleWriter::wake()
{
    const uint64_t one = 1;
    // An eventfd write never blocks short of 2^64 - 2 pending wake-ups.
    [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof one);
}

void ConsoleWriter::pump()
{
    if (writing_ || stopped_ || failed_)
        return;
    if (chunk_done_ == chunk_.size()) {
        chunk_ = serial_.take_output(chunk_size);
        chunk_done_ = 0;
        if (chunk_.empty())
            return;
    }
    iov_ = {chunk_.data() + chunk_done_, chunk_.size() - chunk_done_};
    writing_ = true;
    loop_.writev(fd_, &iov_, 1, current_position, [this](int32_t res) { on_written(res); });
}

void ConsoleWriter::on_written(int32_t res)
{
    writing_ = false;
    if (res == -ECANCELED || res == -EINTR || res == -EAGAIN) {
        pump();
        return;
    }
    if (res <= 0) {
        fail(res < 0 ? -res : EPIPE);
        return;
    }
    chunk_done_ += static_cast<size_t>(res);
    pump();
}

void ConsoleWriter::fail(int err)
{
    // The console is for people; losing it must not take the VM down or flood the log.
    spdlog::warn("serial: writing console output: {}; the rest is discarded", std::strerror(err));
    failed_ = true;
    serial_.set_output_ready(nullptr);
}

void ConsoleWriter::report_drops()
{
    const uint64_t dropped = serial_.output_dropped();
    const auto now = std::chrono::steady_clock::now();
    if (dropped == reported_ || (last_report_ && now - *last_report_ < report_interval))
        return;
    spdlog::warn("serial: console output dropped: its reader is not keeping up ({} bytes so far)", dropped);
    reported_ = dropped;
    last_report_ = now;
}

void ConsoleWriter::stop()
{
    stopped_ = true;
    if (writing_)
        loop_.cancel_io(fd_);
}

void ConsoleWriter::finish()
{
    stopped_ = true;
    std::string rest = chunk_.substr(chunk_done_);
    chunk_.clear();
    chunk_done_ = 0;
    for (std::string more; !(more = serial_.take_output(SerialDevice::output_capacity)).empty();)
        rest += more;
    if (failed_)
        return;  // already reported
    size_t done = 0;
    while (done < rest.size()) {
        // At most PIPE_BUF at a time: once a pipe polls writable it takes that much without
        // blocking, so a reader who stalls right now costs one poll timeout, not a hang.
        pollfd p{fd_, POLLOUT, 0};
        const int ready = ::poll(&p, 1, finish_patience_ms);
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready <= 0 || (p.revents & (POLLERR | POLLHUP | POLLNVAL)))
            break;
        const ssize_t n = ::write(fd_, rest.data() + done, std::min<size_t>(PIPE_BUF, rest.size() - done));
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0)
            break;
        done += static_cast<size_t>(n);
    }
    unwritten_ += rest.size() - done;
    if (const uint64_t lost = dropped(); lost > 0)
        spdlog::warn("serial: console output dropped: {} bytes in all (its reader did not keep up)", lost);
}

uint64_t ConsoleWriter::dropped() const
{
    return serial_.output_dropped() + unwritten_;
}

} // namespace agentvm
