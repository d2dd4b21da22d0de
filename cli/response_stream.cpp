#include "cli/response_stream.hpp"

#include <unistd.h>

#include <cerrno>
#include <utility>

#include <fmt/format.h>

namespace agentvm {
namespace {

constexpr size_t read_size = 256 * 1024;

} // namespace

ResponseStream::ResponseStream(EventLoop& loop, int fd, size_t max_line, Handlers handlers)
    : loop_(loop), fd_(fd), max_line_(max_line), handlers_(std::move(handlers))
{
}

ResponseStream::~ResponseStream()
{
    if (watching_)
        loop_.unwatch(fd_);
}

void ResponseStream::start()
{
    if (watching_ || stopped_ || paused_)
        return;
    watching_ = true;
    loop_.watch_readable(fd_, [this] { on_readable(); });
}

void ResponseStream::pause()
{
    paused_ = true;
    if (watching_) {
        loop_.unwatch(fd_);
        watching_ = false;
    }
}

void ResponseStream::resume()
{
    paused_ = false;
    start();
}

void ResponseStream::on_readable()
{
    static thread_local std::string buffer(read_size, '\0');
    const ssize_t n = ::read(fd_, buffer.data(), buffer.size());
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n > 0) {
        std::string_view bytes(buffer.data(), static_cast<size_t>(n));
        while (!bytes.empty()) {
            const size_t newline = bytes.find('\n');
            if (!take(bytes.substr(0, newline)))
                return;
            if (newline == std::string_view::npos)
                break;
            if (!end_line())
                return;
            bytes.remove_prefix(newline + 1);
        }
        if (line_started_ && scanner_.id())
            handlers_.on_progress(*scanner_.id());
        return;
    }
    const int err = n < 0 ? errno : 0;
    stopped_ = true;
    pause();
    // A last line without '\n' still counts, as on the agent's side.
    if (line_started_ && !end_line())
        return;
    handlers_.on_end(err);
}

bool ResponseStream::take(std::string_view bytes)
{
    if (bytes.empty())
        return true;
    line_started_ = true;
    line_bytes_ += bytes.size();
    if (line_bytes_ > max_line_) {
        bad_line(fmt::format("the guest agent sent a line longer than {} bytes", max_line_));
        return false;
    }
    if (!scanner_.feed(bytes)) {
        bad_line("the guest agent sent a line that is not a JSON object");
        return false;
    }
    if (passing_) {
        handlers_.on_bytes(std::string(bytes));
    } else if (held_.size() + bytes.size() <= max_held_line) {
        held_.append(bytes);
    } else {
        passing_ = true;
        held_.append(bytes);
        handlers_.on_bytes(std::exchange(held_, {}));
    }
    return true;
}

bool ResponseStream::end_line()
{
    const auto summary = scanner_.finish();
    if (!summary) {
        bad_line("the guest agent sent a line that is not a JSON object");
        return false;
    }
    held_.push_back('\n');
    handlers_.on_bytes(std::exchange(held_, {}));
    passing_ = false;
    line_started_ = false;
    line_bytes_ = 0;
    handlers_.on_line(*summary);
    return true;
}

void ResponseStream::stop()
{
    stopped_ = true;
    pause();
    if (passing_)
        handlers_.on_bytes("\n");
    passing_ = false;
}

void ResponseStream::bad_line(const std::string& why)
{
    stop();
    handlers_.on_bad_line(why);
}

} // namespace agentvm
