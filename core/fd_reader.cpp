#include "core/fd_reader.hpp"

#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>

namespace agentvm {
namespace {

constexpr size_t read_size = 256 * 1024;

} // namespace

FdReader::FdReader(EventLoop& loop, int fd, Handlers handlers)
    : loop_(loop), fd_(fd), handlers_(std::move(handlers))
{
}

FdReader::~FdReader()
{
    if (watching_)
        loop_.unwatch(fd_);
}

void FdReader::start()
{
    if (watching_ || ended_ || paused_)
        return;
    watching_ = true;
    loop_.watch_readable(fd_, [this] { on_readable(); });
}

void FdReader::pause()
{
    paused_ = true;
    if (watching_) {
        loop_.unwatch(fd_);
        watching_ = false;
    }
}

void FdReader::resume()
{
    paused_ = false;
    start();
}

void FdReader::stop()
{
    ended_ = true;
    pause();
}

void FdReader::on_readable()
{
    // One buffer per thread: every reader on a loop reads on its thread, one at a time.
    static thread_local std::string buffer(read_size, '\0');
    const ssize_t n = ::read(fd_, buffer.data(), buffer.size());
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n > 0) {
        handlers_.on_bytes({buffer.data(), static_cast<size_t>(n)});
        return;
    }
    const int err = n < 0 ? errno : 0;
    stop();
    handlers_.on_end(err);
}

} // namespace agentvm
