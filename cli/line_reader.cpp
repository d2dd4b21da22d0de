#include "cli/line_reader.hpp"

#include <unistd.h>

#include <cerrno>
#include <string>

namespace agentvm {
namespace {

constexpr size_t read_size = 256 * 1024;

} // namespace

LineReader::LineReader(EventLoop& loop, int fd, size_t max_line, Handlers handlers)
    : loop_(loop), fd_(fd), handlers_(std::move(handlers)),
      framer_(max_line, [this](std::string&& line) { handlers_.on_line(std::move(line)); },
              [this] { handlers_.on_too_long(); })
{
}

LineReader::~LineReader()
{
    if (watching_)
        loop_.unwatch(fd_);
}

void LineReader::start()
{
    if (watching_ || ended_ || paused_)
        return;
    watching_ = true;
    loop_.watch_readable(fd_, [this] { on_readable(); });
}

void LineReader::pause()
{
    paused_ = true;
    if (watching_) {
        loop_.unwatch(fd_);
        watching_ = false;
    }
}

void LineReader::resume()
{
    paused_ = false;
    start();
}

void LineReader::on_readable()
{
    static thread_local std::string buffer(read_size, '\0');
    const ssize_t n = ::read(fd_, buffer.data(), buffer.size());
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n > 0) {
        framer_.feed({buffer.data(), static_cast<size_t>(n)});
        if (on_partial_ && !ended_ && !framer_.partial().empty())
            on_partial_(framer_.partial());
        return;
    }
    const int err = n < 0 ? errno : 0;
    ended_ = true;
    loop_.unwatch(fd_);
    watching_ = false;
    framer_.finish();
    handlers_.on_end(err);
}

} // namespace agentvm
