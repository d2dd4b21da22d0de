// Durations the command line takes as floating-point seconds (--boot-timeout 2.5). They become
// whole milliseconds or clock ticks: NaN, infinities, negatives and values past the cap would
// make that conversion undefined, so the option's own check refuses them, naming the option.
#pragma once

#include <chrono>

#include <CLI/CLI.hpp>

namespace agentvm {

// A year: far beyond any boot, call or episode, and far inside what the clocks can hold.
inline constexpr double max_option_seconds = 365.0 * 24 * 3600;

// A check for an option's seconds: finite, above 0 (or at least 0 when zero_allowed, for
// options where 0 means "no limit"), and at most max_seconds.
CLI::Validator seconds_option(bool zero_allowed = false, double max_seconds = max_option_seconds);

// A check for a plain number (--cpu-quota's cores): finite, at least 0, at most `max`.
CLI::Validator bounded_number(double max, const char* unit);

// For values seconds_option() accepted.
std::chrono::milliseconds seconds_to_ms(double seconds);

} // namespace agentvm
