#include "guest/agent/process_stdin.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "protocol/agent_protocol.hpp"

namespace agentvm {

ProcessStdin::ProcessStdin(Fd pipe, bool is_pty)
    : pipe_(std::move(pipe)), wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)), is_pty_(is_pty)
{
    if (!wake_)
        throw CallError("spawn_failed", std::string("eventfd: ") + std::strerror(errno));
    ::fcntl(pipe_.get(), F_SETFL, ::fcntl(pipe_.get(), F_GETFL) | O_NONBLOCK);
}

void ProcessStdin::feed(std::string_view data)
{
    std::lock_guard lock(mutex_);
    if (closed_ || close_requested_)
        throw CallError("stdin_closed", "the process's stdin is closed");
    if (pending_.size() + data.size() > max_pending_bytes)
        throw CallError("limit", "the process has not read " + std::to_string(pending_.size())
                                     + " bytes of its stdin yet; at most " + std::to_string(max_pending_bytes)
                                     + " may wait");
    pending_.append(data);
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof(one));
}

void ProcessStdin::close()
{
    std::lock_guard lock(mutex_);
    if (is_pty_)
        throw CallError("bad_field", "a pty's input is not closed: send it end of file (\"\\u0004\") instead");
    if (closed_ || close_requested_)
        return;
    close_requested_ = true;
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof(one));
}

int ProcessStdin::fd() const
{
    std::lock_guard lock(mutex_);
    if (closed_)
        return -1;
    return pending_.empty() ? wake_.get() : pipe_.get();
}

short ProcessStdin::events() const
{
    std::lock_guard lock(mutex_);
    return pending_.empty() ? POLLIN : POLLOUT;
}

bool ProcessStdin::ready(short)
{
    uint64_t count;
    [[maybe_unused]] ssize_t n = ::read(wake_.get(), &count, sizeof(count));
    std::lock_guard lock(mutex_);
    write_pending();
    return false;
}

void ProcessStdin::write_pending()
{
    while (!closed_ && !pending_.empty()) {
        const ssize_t n = ::write(pipe_.get(), pending_.data(), pending_.size());
        if (n > 0) {
            pending_.erase(0, static_cast<size_t>(n));
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        // The reader is gone (EPIPE): nothing more will reach it.
        closed_ = true;
        pending_.clear();
    }
    if (close_requested_ && pending_.empty() && !closed_) {
        closed_ = true;
        pipe_.reset();
    }
}

void ProcessStdin::over()
{
    std::lock_guard lock(mutex_);
    closed_ = true;
    pending_.clear();
    if (!is_pty_)
        pipe_.reset();
}

} // namespace agentvm
