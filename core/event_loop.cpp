#include "core/event_loop.hpp"

#include <poll.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"

namespace agentvm {

namespace {

using Clock = std::chrono::steady_clock;

// user_data of a cancellation is its target Op's address with this bit set (Ops are at
// least 8-byte aligned), so both CQEs find the same Op.
constexpr uint64_t cancel_tag = 1;

__kernel_timespec timespec_of(std::chrono::steady_clock::duration d)
{
    const auto ns = std::max<int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count(), 0);
    __kernel_timespec ts{};
    ts.tv_sec = ns / 1'000'000'000;
    ts.tv_nsec = ns % 1'000'000'000;
    return ts;
}

// The I/O thread's seccomp filter lets it call io_uring_enter, and an SQE can do much of what
// that filter forbids as a system call (IORING_OP_OPENAT, SOCKET, CONNECT, ...). So the ring
// is created disabled and, before it runs anything, limited to the opcodes this file
// prepares; the kernel completes any other SQE with -EACCES. SQE flags are left out of the
// restrictions, so none is allowed (this file sets none), and so are register operations:
// once enabled the ring refuses every io_uring_register (files, buffers, personalities,
// wider restrictions); the loop makes none.
void restrict_to_loop_opcodes(io_uring& ring)
{
    std::vector<io_uring_restriction> allowed;
    const auto allow = [&](io_uring_op op) {
        io_uring_restriction r{};
        r.opcode = IORING_RESTRICTION_SQE_OP;
        r.sqe_op = static_cast<uint8_t>(op);
        allowed.push_back(r);
    };
    allow(IORING_OP_POLL_ADD);      // watches, and I/O waiting for readiness after -EAGAIN
    allow(IORING_OP_ASYNC_CANCEL);  // unwatch, drain's cancellation, cancel_io
    allow(IORING_OP_READV);
    allow(IORING_OP_WRITEV);
    allow(IORING_OP_FSYNC);
    // io_uring_submit_and_wait_timeout hands the timeout to io_uring_enter itself where the
    // kernel has IORING_FEAT_EXT_ARG (5.11 on); without it (5.10, the first kernel with
    // restrictions) liburing queues an IORING_OP_TIMEOUT SQE instead, which must then pass.
    // A timeout names no file: it opens nothing and reaches nothing.
    if (!(ring.features & IORING_FEAT_EXT_ARG))
        allow(IORING_OP_TIMEOUT);
    int ret = io_uring_register_restrictions(&ring, allowed.data(), static_cast<unsigned>(allowed.size()));
    if (ret < 0)
        throw_errno("io_uring_register_restrictions", -ret);
    ret = io_uring_enable_rings(&ring);
    if (ret < 0)
        throw_errno("io_uring_enable_rings", -ret);
}

} // namespace

// Every SQE that carries user_data points at one of these, allocated when the SQE is
// prepared and freed when its last CQE has been reaped.
struct EventLoop::Op {
    enum class Kind { io, poll, io_wait };
    Kind kind = Kind::io;
    Completion done;         // io, io_wait
    Prep prep;               // io: fills its SQE, again after an -EAGAIN
    short ready_events = 0;  // io: what to poll fd for after an -EAGAIN; 0 = never retry
    int fd = -1;             // poll: the watched fd; io: the fd read or written
    bool cancelled = false;  // poll: unwatched; its completion is ignored
    // CQEs still to come that name this Op: 1, plus one per cancellation aimed at it (a
    // poll being unwatched, I/O cancelled by drain()). The Op outlives the cancel's CQE so
    // its address cannot be reused by a new Op that the cancellation would then hit.
    unsigned refs = 1;

    // A CQE naming the Op has been reaped; the last one frees it.
    static void release(Op* op)
    {
        if (--op->refs == 0)
            delete op;
    }
};

struct EventLoop::Watch {
    std::function<void()> on_readable;
    Op* poll = nullptr;  // the armed poll; null only while its completion is dispatched
};

EventLoop::EventLoop(unsigned entries)
{
    stop_fd_ = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!stop_fd_)
        throw_errno("eventfd for the event loop");
    const int ret = io_uring_queue_init(entries, &ring_, IORING_SETUP_R_DISABLED);
    if (ret < 0)
        throw_errno(fmt::format("io_uring_queue_init({} entries)", entries), -ret);
    try {
        restrict_to_loop_opcodes(ring_);
        watch_readable(stop_fd_.get(), [this] {
            uint64_t count = 0;
            // Nonblocking, and a spurious wake-up leaves nothing to read: the result is moot.
            [[maybe_unused]] ssize_t n = ::read(stop_fd_.get(), &count, sizeof count);
            stopping_ = true;
        });
    } catch (...) {
        io_uring_queue_exit(&ring_);
        throw;
    }
}

EventLoop::~EventLoop()
{
    try {
        for (auto& [fd, watch] : watches_)
            if (watch->poll)
                cancel_poll(*watch->poll);
    } catch (const std::exception& e) {
        // Not reached in practice (get_sqe only fails if submit does); the polls then stay
        // armed and are torn down with the ring.
        spdlog::error("event loop: cancelling watches: {}", e.what());
    }
    watches_.clear();

    // The kernel may still be reading into or writing from the callers' buffers: wait for
    // every outstanding CQE. Completions do not run any more; their owners are going away.
    // As in drain(), I/O that waits on a peer is cancelled after a while, and the wait is
    // given up rather than hang the process for good.
    auto deadline = Clock::now() + default_drain_patience;
    bool cancelled = false;
    while (cqes_pending_ > 0) {
        const auto now = Clock::now();
        if (now >= deadline) {
            if (cancelled) {
                spdlog::error("event loop: {} operation(s) still in the kernel at exit; not waiting for them",
                              cqes_pending_);
                break;
            }
            cancel_in_flight();
            cancelled = true;
            deadline = now + default_drain_patience;
        }
        const __kernel_timespec timeout = timespec_of(deadline - now);
        io_uring_cqe* first = nullptr;
        const int ret = io_uring_submit_and_wait_timeout(&ring_, &first, 1,
                                                         const_cast<__kernel_timespec*>(&timeout), nullptr);
        if (ret < 0 && ret != -EINTR && ret != -ETIME) {
            spdlog::error("event loop: waiting for {} completions at exit: {}", cqes_pending_,
                          std::strerror(-ret));
            break;
        }
        io_uring_cqe* cqe = nullptr;
        while (io_uring_peek_cqe(&ring_, &cqe) == 0) {
            const uint64_t user_data = io_uring_cqe_get_data64(cqe);
            io_uring_cqe_seen(&ring_, cqe);
            --cqes_pending_;
            auto* op = reinterpret_cast<Op*>(user_data & ~cancel_tag);
            if (!(user_data & cancel_tag))
                in_flight_.erase(op);
            Op::release(op);
        }
    }
    io_uring_queue_exit(&ring_);
}

void EventLoop::watch_readable(int fd, std::function<void()> on_readable)
{
    if (watches_.contains(fd))
        throw Error(fmt::format("event loop: fd {} is already watched", fd));
    auto watch = std::make_shared<Watch>();
    watch->on_readable = std::move(on_readable);
    arm_poll(*watch, fd);
    watches_.emplace(fd, std::move(watch));
}

void EventLoop::unwatch(int fd)
{
    const auto it = watches_.find(fd);
    if (it == watches_.end())
        return;
    if (it->second->poll)
        cancel_poll(*it->second->poll);
    watches_.erase(it);
}

void EventLoop::submit_io(Completion done, Prep prep, int fd, short ready_events)
{
    auto op = std::make_unique<Op>();
    op->done = std::move(done);
    op->prep = std::move(prep);
    op->fd = fd;
    op->ready_events = ready_events;
    in_flight_.insert(op.get());
    try {
        submit(*op);
    } catch (...) {
        in_flight_.erase(op.get());
        throw;
    }
    op.release();
}

void EventLoop::submit(Op& op)
{
    io_uring_sqe* sqe = get_sqe();
    op.kind = Op::Kind::io;
    op.prep(sqe);
    io_uring_sqe_set_data(sqe, &op);
    ++cqes_pending_;
}

int EventLoop::resubmit(Op& op, bool wait_for_readiness)
{
    int err = 0;
    io_uring_sqe* sqe = try_get_sqe(err);
    if (!sqe)
        return err;
    if (wait_for_readiness) {
        op.kind = Op::Kind::io_wait;
        io_uring_prep_poll_add(sqe, op.fd, op.ready_events);
    } else {
        op.kind = Op::Kind::io;
        op.prep(sqe);
    }
    io_uring_sqe_set_data(sqe, &op);
    ++cqes_pending_;
    return 0;
}

void EventLoop::cancel_in_flight()
{
    for (Op* op : in_flight_) {
        int err = 0;
        io_uring_sqe* sqe = try_get_sqe(err);
        if (!sqe) {
            spdlog::error("event loop: cannot cancel I/O in flight: {}", std::strerror(-err));
            return;
        }
        io_uring_prep_cancel64(sqe, reinterpret_cast<uint64_t>(op), 0);
        io_uring_sqe_set_data64(sqe, reinterpret_cast<uint64_t>(op) | cancel_tag);
        ++op->refs;
        ++cqes_pending_;
    }
}

void EventLoop::readv(int fd, const iovec* iov, unsigned count, uint64_t offset, Completion done)
{
    submit_io(std::move(done),
              [=](io_uring_sqe* sqe) { io_uring_prep_readv(sqe, fd, iov, count, offset); }, fd, POLLIN);
}

void EventLoop::writev(int fd, const iovec* iov, unsigned count, uint64_t offset, Completion done)
{
    submit_io(std::move(done),
              [=](io_uring_sqe* sqe) { io_uring_prep_writev(sqe, fd, iov, count, offset); }, fd, POLLOUT);
}

void EventLoop::fsync(int fd, Completion done)
{
    submit_io(std::move(done), [=](io_uring_sqe* sqe) { io_uring_prep_fsync(sqe, fd, 0); });
}

void EventLoop::cancel_io(int fd)
{
    // The kernel matches requests by open file, not fd number: a watch on another fd of the
    // same file (a terminal's stdin beside its stdout) is cancelled too, and ends quietly.
    submit_io([](int32_t) {}, [=](io_uring_sqe* sqe) {
        io_uring_prep_cancel_fd(sqe, fd, IORING_ASYNC_CANCEL_ALL);
    });
}

void EventLoop::run()
{
    try {
        while (!stopping_)
            wait_and_dispatch();
    } catch (...) {
        stopping_ = false;
        throw;
    }
    stopping_ = false;
}

void EventLoop::stop()
{
    const uint64_t one = 1;
    // write(2) on an eventfd is async-signal-safe; it fails only if the counter would
    // overflow, and then a stop is pending anyway.
    [[maybe_unused]] ssize_t n = ::write(stop_fd_.get(), &one, sizeof one);
}

bool EventLoop::drain(std::chrono::milliseconds patience)
{
    auto deadline = Clock::now() + patience;
    bool cancelled = false;
    while (!in_flight_.empty()) {
        const auto now = Clock::now();
        if (now >= deadline) {
            if (cancelled) {
                spdlog::error("event loop: {} I/O operation(s) did not end even when cancelled; giving up on them",
                              in_flight_.size());
                return false;
            }
            // Something waits on a peer that will not act (or on a bug of ours): whatever it
            // is, it must not keep the VMM from ending.
            spdlog::warn("event loop: {} I/O operation(s) still in flight after {} ms; cancelling them",
                         in_flight_.size(), patience.count());
            cancel_in_flight();
            cancelled = true;
            deadline = now + patience;
        }
        const __kernel_timespec timeout = timespec_of(deadline - now);
        wait_and_dispatch(&timeout);
    }
    return true;
}

io_uring_sqe* EventLoop::try_get_sqe(int& err)
{
    if (io_uring_sqe* sqe = io_uring_get_sqe(&ring_))
        return sqe;
    // SQEs are normally handed over in the wait call; a full ring is handed over now.
    const int ret = io_uring_submit(&ring_);
    if (ret < 0) {
        err = ret;
        return nullptr;
    }
    if (io_uring_sqe* sqe = io_uring_get_sqe(&ring_))
        return sqe;
    err = -EBUSY;
    return nullptr;
}

io_uring_sqe* EventLoop::get_sqe()
{
    int err = 0;
    if (io_uring_sqe* sqe = try_get_sqe(err))
        return sqe;
    throw_errno("io_uring_submit with a full submission queue", -err);
}

void EventLoop::arm_poll(Watch& watch, int fd)
{
    auto op = std::make_unique<Op>();
    op->kind = Op::Kind::poll;
    op->fd = fd;
    io_uring_sqe* sqe = get_sqe();
    // One-shot, re-armed after each completion: portable to kernels without multishot
    // poll, and a callback never races a second completion for the same readiness.
    io_uring_prep_poll_add(sqe, fd, POLLIN);
    io_uring_sqe_set_data(sqe, op.get());
    watch.poll = op.release();
    ++cqes_pending_;
}

void EventLoop::cancel_poll(Op& poll)
{
    io_uring_sqe* sqe = get_sqe();
    io_uring_prep_cancel64(sqe, reinterpret_cast<uint64_t>(&poll), 0);
    io_uring_sqe_set_data64(sqe, reinterpret_cast<uint64_t>(&poll) | cancel_tag);
    poll.cancelled = true;
    ++poll.refs;
    ++cqes_pending_;
}

void EventLoop::wait_and_dispatch(const __kernel_timespec* timeout)
{
    io_uring_cqe* first = nullptr;
    const int ret = timeout ? io_uring_submit_and_wait_timeout(&ring_, &first, 1,
                                                               const_cast<__kernel_timespec*>(timeout), nullptr)
                            : io_uring_submit_and_wait(&ring_, 1);
    if (ret < 0 && ret != -EINTR && ret != -ETIME)
        throw_errno("io_uring_submit_and_wait", -ret);
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&ring_, &cqe) == 0) {
        // Consume the CQE before running its callback, so one that throws leaves the
        // ring consistent for the next run() or drain().
        const uint64_t user_data = io_uring_cqe_get_data64(cqe);
        const int32_t res = cqe->res;
        io_uring_cqe_seen(&ring_, cqe);
        dispatch(user_data, res);
    }
}

void EventLoop::dispatch(uint64_t user_data, int32_t res)
{
    --cqes_pending_;
    auto* op = reinterpret_cast<Op*>(user_data & ~cancel_tag);
    // A cancellation's own result (done, or already completed) needs no action.
    if ((user_data & cancel_tag) || op->cancelled) {
        Op::release(op);
        return;
    }
    if (op->kind == Op::Kind::poll) {
        on_poll(op, res);
        return;
    }
    int32_t result = res;
    std::optional<bool> retry_after_poll;
    if (op->kind == Op::Kind::io && res == -EAGAIN && op->ready_events != 0) {
        retry_after_poll = true;
    } else if (op->kind == Op::Kind::io_wait && res >= 0) {
        // Ready (or hung up or in error, which the retried I/O then reports itself); a
        // poll on a closed fd fails the I/O as reading it would.
        if (res & POLLNVAL)
            result = -EBADF;
        else
            retry_after_poll = false;
    }
    if (retry_after_poll) {
        // A retry that went out completes later. One that could not (no SQE to be had) fails
        // the I/O now: it must never stay counted without anything in the kernel to end it.
        result = resubmit(*op, *retry_after_poll);
        if (result == 0)
            return;
    }
    in_flight_.erase(op);
    Completion done = std::move(op->done);
    Op::release(op);
    done(result);
}

void EventLoop::on_poll(Op* poll, int32_t res)
{
    const int fd = poll->fd;
    delete poll;
    // A poll that is not cancelled belongs to a live watch (unwatch cancels first).
    const auto it = watches_.find(fd);
    const std::shared_ptr<Watch> watch = it->second;
    watch->poll = nullptr;
    if (res == -ECANCELED) {
        watches_.erase(it);
        return;
    }
    if (res < 0 || (res & POLLNVAL)) {
        // Re-arming would fail the same way, in a busy loop.
        spdlog::warn("event loop: polling fd {} failed ({}); no longer watching it", fd,
                     res < 0 ? std::strerror(-res) : "not an open fd");
        watches_.erase(it);
        return;
    }
    // Re-arm before the callback so a callback that throws leaves the watch working. The
    // SQE goes to the kernel only at the next wait, after the callback consumed the event.
    arm_poll(*watch, fd);
    watch->on_readable();
}

} // namespace agentvm
