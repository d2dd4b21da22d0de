// The relays' lines on stderr (the guest's console), at most a burst per period: the host (for
// inbound ports) or the guest's own tools (for egress) can open connections at will, and a
// flood of the same complaint says no more than one.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace agentvm {

class RelayLog {
public:
    // topic: what the lines start with after "agentvm-agent: " ("ports", "egress").
    explicit RelayLog(const char* topic) : topic_(topic) {}
    void warn(const std::string& message);

private:
    using Clock = std::chrono::steady_clock;
    static constexpr unsigned burst = 10;
    static constexpr std::chrono::seconds period{5};
    const char* topic_;
    std::mutex mutex_;
    Clock::time_point window_start_{};
    unsigned used_ = 0;
    uint64_t suppressed_ = 0;
};

} // namespace agentvm
