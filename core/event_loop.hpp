// The VMM's single I/O thread: an io_uring that carries both readiness (eventfds from
// ioeventfd, stdin) and the device I/O itself (virtio-blk reads and writes).
//
// Everything here runs on the thread that calls run(); only stop() may be called from
// another thread. Buffers and iovecs handed to read/write must stay valid until the
// completion callback runs.
#pragma once

#include <liburing.h>
#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <unordered_set>

#include "common/fd.hpp"

namespace agentvm {

class EventLoop {
public:
    // res is the io_uring result: bytes transferred, or -errno.
    using Completion = std::function<void(int32_t res)>;

    explicit EventLoop(unsigned entries = 256);
    ~EventLoop();
    EventLoop(const EventLoop&) = delete;
    EventLoop& operator=(const EventLoop&) = delete;

    // Calls on_readable every time fd polls readable, until unwatch(fd) or the loop ends.
    // The callback must consume the readiness (e.g. read the eventfd) or it fires again.
    void watch_readable(int fd, std::function<void()> on_readable);
    void unwatch(int fd);

    // On a socket, pipe or terminal opened O_NONBLOCK the kernel may answer -EAGAIN (it
    // does not always wait for readiness itself); these then wait until fd polls ready and
    // try again, so done() never sees -EAGAIN.
    void readv(int fd, const iovec* iov, unsigned count, uint64_t offset, Completion done);
    void writev(int fd, const iovec* iov, unsigned count, uint64_t offset, Completion done);
    void fsync(int fd, Completion done);
    // Cancels every read and write in flight on fd; their completions run with -ECANCELED
    // (or their result, if they finished first). For I/O on files the VM does not own, such
    // as a write to a stdout nobody reads, which would otherwise keep drain() waiting.
    void cancel_io(int fd);

    // Runs until stop(); rethrows the first exception a callback threw.
    void run();
    // Thread-safe and async-signal-safe.
    void stop();

    // How long drain() waits before it cancels what is still in flight: far longer than any
    // disk request takes, even emulated; only I/O that waits on someone else (a socket whose
    // peer never reads or writes) lasts that long.
    static constexpr std::chrono::milliseconds default_drain_patience{5000};

    // Operations submitted whose completion has not run yet (watches not counted).
    size_t in_flight() const { return in_flight_.size(); }
    // Runs completions until in_flight() is 0: quiesces device I/O (e.g. before a snapshot).
    // Never waits forever: whatever is still in flight after `patience` is cancelled (its
    // completion runs with -ECANCELED) and waited for once more as long; if even that does
    // not end it, logs an error and returns false, with those operations still counted.
    // Rethrows the first exception a completion threw, as run() does.
    bool drain(std::chrono::milliseconds patience = default_drain_patience);

private:
    // The unit test submits raw SQEs through this loop's own ring (submit_io) to prove the
    // ring refuses every opcode the loop does not use.
    friend struct EventLoopTestAccess;

    struct Op;
    struct Watch;
    io_uring_sqe* get_sqe();
    // As get_sqe, but reports a failed io_uring_submit as -errno instead of throwing.
    io_uring_sqe* try_get_sqe(int& err);
    void arm_poll(Watch& watch, int fd);
    void cancel_poll(Op& poll);
    using Prep = std::function<void(io_uring_sqe*)>;
    void submit_io(Completion done, Prep prep, int fd = -1, short ready_events = 0);
    void submit(Op& op);
    // Submits op again (its I/O, or first a poll for readiness); 0, or -errno when no SQE
    // could be had.
    int resubmit(Op& op, bool wait_for_readiness);
    void cancel_in_flight();
    // Waits for at least one completion (or until `timeout`, when given) and runs them all.
    void wait_and_dispatch(const __kernel_timespec* timeout = nullptr);
    void dispatch(uint64_t user_data, int32_t res);
    void on_poll(Op* poll, int32_t res);

    io_uring ring_{};
    Fd stop_fd_;
    bool stopping_ = false;  // a stop() was seen; run() returns and clears it
    // The I/O operations whose completion has not run yet, so drain() can cancel them.
    std::unordered_set<Op*> in_flight_;
    // CQEs still to come for heap Ops (I/O, polls, cancellations): the destructor reaps
    // them all before freeing the Ops and the ring.
    size_t cqes_pending_ = 0;
    // shared_ptr: a callback may unwatch its own fd, and must not destroy itself mid-call.
    std::unordered_map<int, std::shared_ptr<Watch>> watches_;
};

} // namespace agentvm
