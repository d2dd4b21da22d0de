// A log that a guest (or any hostile peer) can trigger at will, kept from flooding the host's:
// at most a burst of warnings per period, and a count of those held back.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace agentvm {

// Lets a guest-triggered warning through at most `burst` times per `period`, so a guest
// cannot flood the host log. Not thread-safe: callers hold their own lock, if any.
class WarnLimiter {
public:
    explicit WarnLimiter(unsigned burst = 10, std::chrono::seconds period = std::chrono::seconds(5))
        : burst_(burst), period_(period)
    {
    }

    // True when this warning may be logged; *suppressed is how many were dropped before it.
    bool allow(uint64_t* suppressed = nullptr)
    {
        const auto now = std::chrono::steady_clock::now();
        if (now - window_start_ >= period_) {
            window_start_ = now;
            used_ = 0;
        }
        if (used_ >= burst_) {
            ++suppressed_;
            return false;
        }
        ++used_;
        if (suppressed)
            *suppressed = suppressed_;
        suppressed_ = 0;
        return true;
    }

private:
    unsigned burst_;
    std::chrono::steady_clock::duration period_;
    std::chrono::steady_clock::time_point window_start_{};
    unsigned used_ = 0;
    uint64_t suppressed_ = 0;
};

// spdlog::warn through a WarnLimiter of the message `describe()` makes, which runs only when
// the warning is let through (a message costly to make, such as a dump of a huge line).
template <typename Describe>
void guest_warn_with(WarnLimiter& limiter, Describe&& describe)
{
    uint64_t suppressed = 0;
    if (!limiter.allow(&suppressed))
        return;
    const std::string message = describe();
    if (suppressed != 0)
        spdlog::warn("{} ({} similar warnings suppressed)", message, suppressed);
    else
        spdlog::warn("{}", message);
}

// spdlog::warn through a WarnLimiter, for anything a guest can trigger at will.
template <typename... Args>
void guest_warn(WarnLimiter& limiter, fmt::format_string<Args...> format, Args&&... args)
{
    guest_warn_with(limiter, [&] { return fmt::format(format, std::forward<Args>(args)...); });
}

} // namespace agentvm
