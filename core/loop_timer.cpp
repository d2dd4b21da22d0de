#include "core/loop_timer.hpp"

#include <sys/timerfd.h>
#include <unistd.h>

#include <cstdint>

#include "common/error.hpp"

namespace agentvm {

LoopTimer::LoopTimer(EventLoop& loop, std::function<void()> on_expiry)
    : loop_(loop), fd_(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK)),
      on_expiry_(std::move(on_expiry))
{
    if (!fd_)
        throw_errno("timerfd_create");
    loop_.watch_readable(fd_.get(), [this] {
        uint64_t expirations = 0;
        // Nothing to read means the timer was re-armed or cancelled after it fired.
        if (::read(fd_.get(), &expirations, sizeof expirations) == sizeof expirations) {
            armed_ = false;
            on_expiry_();
        }
    });
}

LoopTimer::~LoopTimer()
{
    loop_.unwatch(fd_.get());
}

void LoopTimer::arm(std::chrono::nanoseconds after)
{
    // A zero it_value would disarm the timer instead: the shortest delay is 1 ns.
    const auto ns = std::max<int64_t>(after.count(), 1);
    itimerspec spec{};
    spec.it_value.tv_sec = ns / 1'000'000'000;
    spec.it_value.tv_nsec = ns % 1'000'000'000;
    if (::timerfd_settime(fd_.get(), 0, &spec, nullptr) != 0)
        throw_errno("timerfd_settime");
    armed_ = true;
}

void LoopTimer::cancel()
{
    if (!armed_)
        return;
    armed_ = false;
    const itimerspec zero{};
    if (::timerfd_settime(fd_.get(), 0, &zero, nullptr) != 0)
        throw_errno("timerfd_settime");
}

} // namespace agentvm
