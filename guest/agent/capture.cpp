#include "guest/agent/capture.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "guest/agent/process.hpp"

namespace agentvm {

Capture::Capture(const char* name, Fd fd, uint64_t limit, bool in_response)
    : name_(name), fd_(std::move(fd)), limit_(limit), in_response_(in_response)
{
    ::fcntl(fd_.get(), F_SETFL, ::fcntl(fd_.get(), F_GETFL) | O_NONBLOCK);
}

bool Capture::read_some(const Json& id, Outbox* stream_to)
{
    char buffer[64 * 1024];
    const ssize_t n = ::read(fd_.get(), buffer, sizeof(buffer));
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return false;
    if (n <= 0) {
        fd_.reset();
        return false;
    }
    const std::string_view chunk(buffer, static_cast<size_t>(n));
    if (tee_)
        tee_->append_output(name_, chunk);
    const size_t room = static_cast<size_t>(std::min<uint64_t>(limit_ - kept_bytes_, chunk.size()));
    if (room < chunk.size())
        truncated_ = true;
    const std::string_view kept = chunk.substr(0, room);
    kept_bytes_ += kept.size();
    if (in_response_)
        kept_.append(kept);
    if (stream_to && !kept.empty()) {
        Json event{{"id", id}, {"event", name_}};
        put_bytes(event, "data", std::string(kept));
        stream_to->send(to_line(event));
    }
    return true;
}

void Capture::put(Json& response)
{
    if (in_response_)
        put_bytes(response, name_, std::move(kept_));
    response[std::string(name_) + "_truncated"] = truncated_;
}

} // namespace agentvm
