// Durations the command line takes as floating-point seconds (--boot-timeout 2.5). They become
// whole milliseconds or clock ticks (episode/seconds.hpp): NaN, infinities, negatives and values
// past the cap would make that conversion undefined, so the option's own check refuses them,
// naming the option.
#pragma once

#include <CLI/CLI.hpp>

#include "episode/seconds.hpp"

namespace agentvm {

// A check for an option's seconds: finite, above 0 (or at least 0 when zero_allowed, for
// options where 0 means "no limit"), and at most max_seconds.
CLI::Validator seconds_option(bool zero_allowed = false, double max_seconds = max_option_seconds);

// A check for a plain number (--cpu-quota's cores): finite, at least 0, at most `max`.
CLI::Validator bounded_number(double max, const char* unit);

} // namespace agentvm
