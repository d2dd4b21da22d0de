// Durations the command line gives as floating-point seconds (--boot-timeout 2.5), as whole
// milliseconds. NaN, infinities, negatives and values past max_option_seconds would make the
// conversion undefined: each such flag's own check refuses them first (cli/seconds_option.hpp).
#pragma once

#include <chrono>
#include <cmath>

namespace agentvm {

// A year: far beyond any boot, call or episode, and far inside what the clocks can hold.
inline constexpr double max_option_seconds = 365.0 * 24 * 3600;

inline std::chrono::milliseconds seconds_to_ms(double seconds)
{
    return std::chrono::milliseconds(std::llround(seconds * 1000));
}

} // namespace agentvm
