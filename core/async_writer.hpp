// Ordered writes to one fd through the event loop: bytes queue up and go out one write at a
// time, so a slow reader (a harness not reading our stdout, a busy guest) never blocks the
// loop that runs the VM's devices.
#pragma once

#include <sys/uio.h>

#include <deque>
#include <functional>
#include <string>

#include "core/event_loop.hpp"

namespace agentvm {

class AsyncWriter {
public:
    // on_error gets the errno of a failed write (EPIPE: the reader went away). Whatever was
    // queued is dropped then, and later writes are ignored.
    AsyncWriter(EventLoop& loop, int fd, std::function<void(int err)> on_error);
    AsyncWriter(const AsyncWriter&) = delete;
    AsyncWriter& operator=(const AsyncWriter&) = delete;

    void write(std::string bytes);
    size_t queued_bytes() const { return queued_bytes_; }
    // Runs `done` once everything queued so far is written (at once if nothing is queued).
    void when_flushed(std::function<void()> done);

    // The loop is about to stop and must not wait on a reader that may never read: cancels
    // the write in flight, keeping its bytes queued, and from now on only queues.
    void stop();
    // After the loop has stopped: writes what is still queued with plain blocking writes.
    void flush_blocking();

private:
    void start_write();

    EventLoop& loop_;
    int fd_;
    std::function<void(int)> on_error_;
    std::deque<std::string> queue_;
    size_t head_offset_ = 0;  // bytes of queue_.front() already written
    size_t queued_bytes_ = 0;
    iovec iov_{};
    bool writing_ = false;
    bool failed_ = false;
    bool stopped_ = false;
    std::function<void()> on_flushed_;
};

} // namespace agentvm
