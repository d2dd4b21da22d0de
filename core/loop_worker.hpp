// A thread beside the I/O loop for work that must neither hold up the loop nor pause the
// guest: a live snapshot's copying and hashing. post() runs `work` on the thread, one job at a
// time in order, then `done` on the loop's thread with what `work` threw (or nothing).
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "common/fd.hpp"
#include "core/event_loop.hpp"

namespace agentvm {

class LoopWorker {
public:
    using Done = std::function<void(std::exception_ptr failure)>;

    // Starts the thread, which first runs `on_start` (its seccomp filter): if that throws,
    // every job fails with what it threw. Throws Error when the thread or its eventfd cannot
    // be had.
    LoopWorker(EventLoop& loop, std::function<void()> on_start);
    // Joins as stop() does.
    ~LoopWorker();
    LoopWorker(const LoopWorker&) = delete;
    LoopWorker& operator=(const LoopWorker&) = delete;

    // On the loop's thread. After stop(), `done` runs at once with a failure.
    void post(std::function<void()> work, Done done);
    // On the loop's thread, or after the loop has ended: waits for the job running, then runs
    // the `done` of every job not yet reported (those never started fail with "the VM
    // stopped"), and joins the thread.
    void stop();

private:
    struct Job {
        std::function<void()> work;
        Done done;
        std::exception_ptr failure;
    };
    void thread_main(const std::function<void()>& on_start);
    void report();

    EventLoop& loop_;
    Fd wakeup_;  // eventfd: jobs finished
    std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<Job> queued_;
    std::deque<Job> finished_;
    bool stopping_ = false;
    bool stopped_ = false;  // on the loop's thread: stop() has run
    std::thread thread_;
};

} // namespace agentvm
