#include "episode/response_stream.hpp"

#include <utility>

#include <fmt/format.h>

namespace agentvm {

ResponseStream::ResponseStream(EventLoop& loop, int fd, size_t max_line, Handlers handlers)
    : max_line_(max_line), handlers_(std::move(handlers)),
      reader_(loop, fd,
              {[this](std::string_view bytes) { on_bytes(bytes); }, [this](int err) { on_end(err); }})
{
}

void ResponseStream::on_bytes(std::string_view bytes)
{
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
    if (line_started_ && !dropping_ && scanner_.id())
        handlers_.on_progress(*scanner_.id());
}

void ResponseStream::on_end(int err)
{
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
        if (!dropping_)
            handlers_.on_bytes(std::string(bytes));
    } else if (held_.size() + bytes.size() <= max_held_line) {
        held_.append(bytes);
    } else {
        // Too long to hold: decided on now, by the id as far as it has come (an honest agent
        // writes it first).
        passing_ = true;
        dropping_ = !handlers_.wanted(scanner_.id());
        held_.append(bytes);
        std::string first = std::exchange(held_, {});
        if (!dropping_)
            handlers_.on_bytes(std::move(first));
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
    if (!passing_)
        dropping_ = !handlers_.wanted(summary->id);
    const bool dropped = dropping_;
    if (!dropped) {
        held_.push_back('\n');
        handlers_.on_bytes(std::exchange(held_, {}));
    }
    held_.clear();
    passing_ = false;
    dropping_ = false;
    line_started_ = false;
    line_bytes_ = 0;
    if (dropped)
        handlers_.on_dropped(*summary);
    else
        handlers_.on_line(*summary);
    return true;
}

void ResponseStream::stop()
{
    reader_.stop();
    if (passing_ && !dropping_)
        handlers_.on_bytes("\n");
    passing_ = false;
    dropping_ = false;
}

void ResponseStream::bad_line(const std::string& why)
{
    stop();
    handlers_.on_bad_line(why);
}

} // namespace agentvm
