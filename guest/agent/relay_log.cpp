#include "guest/agent/relay_log.hpp"

#include <cstdio>

namespace agentvm {

void RelayLog::warn(const std::string& message)
{
    std::lock_guard lock(mutex_);
    const auto now = Clock::now();
    if (now - window_start_ >= period) {
        window_start_ = now;
        used_ = 0;
    }
    if (used_ >= burst) {
        ++suppressed_;
        return;
    }
    ++used_;
    if (suppressed_ != 0)
        std::fprintf(stderr, "agentvm-agent: %s: %s (%llu similar lines suppressed)\n", topic_, message.c_str(),
                     static_cast<unsigned long long>(suppressed_));
    else
        std::fprintf(stderr, "agentvm-agent: %s: %s\n", topic_, message.c_str());
    suppressed_ = 0;
}

} // namespace agentvm
