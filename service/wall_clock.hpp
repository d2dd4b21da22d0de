// Times as the API shows them: seconds since the Unix epoch, with a fraction.
#pragma once

#include <chrono>

namespace agentvm {

inline double unix_seconds(std::chrono::system_clock::time_point when)
{
    return std::chrono::duration<double>(when.time_since_epoch()).count();
}

} // namespace agentvm
