#include "core/loop_worker.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "common/error.hpp"

namespace agentvm {

LoopWorker::LoopWorker(EventLoop& loop, std::function<void()> on_start)
    : loop_(loop), wakeup_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK))
{
    if (!wakeup_)
        throw_errno("eventfd for the VM's worker thread");
    loop_.watch_readable(wakeup_.get(), [this] { report(); });
    try {
        thread_ = std::thread([this, on_start = std::move(on_start)] { thread_main(on_start); });
    } catch (const std::system_error& e) {
        loop_.unwatch(wakeup_.get());
        throw Error(fmt::format("starting the VM's worker thread: {}", e.what()));
    }
}

LoopWorker::~LoopWorker()
{
    stop();
}

void LoopWorker::thread_main(const std::function<void()>& on_start)
{
    std::exception_ptr start_failure;
    try {
        on_start();
    } catch (...) {
        start_failure = std::current_exception();
    }
    std::unique_lock lock(mutex_);
    for (;;) {
        cv_.wait(lock, [this] { return stopping_ || !queued_.empty(); });
        if (queued_.empty())
            return;
        Job job = std::move(queued_.front());
        queued_.pop_front();
        lock.unlock();
        if (start_failure) {
            job.failure = start_failure;
        } else {
            try {
                job.work();
            } catch (...) {
                job.failure = std::current_exception();
            }
        }
        job.work = nullptr;  // what it holds goes here, not on the loop's thread
        lock.lock();
        finished_.push_back(std::move(job));
        const uint64_t one = 1;
        [[maybe_unused]] const ssize_t n = ::write(wakeup_.get(), &one, sizeof one);
    }
}

void LoopWorker::post(std::function<void()> work, Done done)
{
    if (stopped_) {
        done(std::make_exception_ptr(Error("the VM stopped")));
        return;
    }
    {
        std::lock_guard lock(mutex_);
        queued_.push_back({std::move(work), std::move(done), nullptr});
    }
    cv_.notify_one();
}

void LoopWorker::report()
{
    uint64_t count = 0;
    [[maybe_unused]] const ssize_t n = ::read(wakeup_.get(), &count, sizeof count);
    std::deque<Job> finished;
    {
        std::lock_guard lock(mutex_);
        finished.swap(finished_);
    }
    for (Job& job : finished)
        job.done(job.failure);
}

void LoopWorker::stop()
{
    if (stopped_)
        return;
    stopped_ = true;
    std::deque<Job> unstarted;
    {
        std::lock_guard lock(mutex_);
        stopping_ = true;
        unstarted.swap(queued_);
    }
    cv_.notify_one();
    if (thread_.joinable())
        thread_.join();
    loop_.unwatch(wakeup_.get());
    report();
    for (Job& job : unstarted)
        job.done(std::make_exception_ptr(Error("the VM stopped")));
}

} // namespace agentvm
