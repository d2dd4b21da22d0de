#include "cli/seconds_option.hpp"

#include <cmath>

#include <fmt/format.h>

namespace agentvm {

CLI::Validator seconds_option(bool zero_allowed, double max_seconds)
{
    const std::string wanted = fmt::format("must be a number of seconds {} 0 and at most {}",
                                           zero_allowed ? "of at least" : "above", max_seconds);
    return CLI::Validator(
        [=](std::string& input) -> std::string {
            double value = 0;
            if (!CLI::detail::lexical_cast(input, value))
                return fmt::format("'{}' is not a number; it {}", input, wanted);
            const bool in_range = std::isfinite(value) && (zero_allowed ? value >= 0 : value > 0) &&
                                  value <= max_seconds;
            return in_range ? std::string() : fmt::format("'{}' is out of range: it {}", input, wanted);
        },
        "SECONDS");
}

CLI::Validator bounded_number(double max, const char* unit)
{
    const std::string wanted = fmt::format("must be a number of {} from 0 to {}", unit, max);
    return CLI::Validator(
        [=](std::string& input) -> std::string {
            double value = 0;
            if (!CLI::detail::lexical_cast(input, value))
                return fmt::format("'{}' is not a number; it {}", input, wanted);
            const bool in_range = std::isfinite(value) && value >= 0 && value <= max;
            return in_range ? std::string() : fmt::format("'{}' is out of range: it {}", input, wanted);
        },
        "NUMBER");
}

} // namespace agentvm
