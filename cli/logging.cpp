#include "cli/logging.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"

namespace agentvm {

void setup_logging(const std::string& level)
{
    // Installed before the level is checked, so that a bad level is reported on stderr too.
    auto logger = spdlog::stderr_color_mt("agentvm");
    logger->set_pattern("agentvm: %^%l%$: %v");
    spdlog::set_default_logger(logger);
    const auto parsed = spdlog::level::from_str(level);
    // from_str maps unknown names to "off"; only "off" itself may mean off.
    if (parsed == spdlog::level::off && level != "off")
        throw Error("unknown --log-level '" + level + "' (use trace, debug, info, warn, error, critical, off)");
    // Debugging a start-up is mostly asking where the time went: debug and trace lines say when.
    if (parsed <= spdlog::level::debug)
        logger->set_pattern("agentvm: %H:%M:%S.%f %^%l%$: %v");
    spdlog::set_level(parsed);
}

} // namespace agentvm
