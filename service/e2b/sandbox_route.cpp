#include "service/e2b/sandbox_route.hpp"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "service/sandbox_ids.hpp"

namespace agentvm {

std::shared_ptr<Sandbox> routed_sandbox(SandboxManager& manager, const std::string& sandbox_id)
{
    std::shared_ptr<Sandbox> sandbox = manager.find(sandbox_id);
    if (!sandbox || sandbox->stopping())
        return nullptr;
    return sandbox;
}

Refusal sandbox_not_running(SandboxManager& manager, const std::string& sandbox_id)
{
    if (manager.find_paused(sandbox_id))
        return {ServiceError::ended, fmt::format("sandbox {} is paused: connect to it to resume it", sandbox_id),
                std::nullopt};
    if (const std::optional<std::string> reason = manager.ended_reason(sandbox_id))
        return {ServiceError::ended, fmt::format("sandbox {} has ended ({})", sandbox_id, *reason), std::nullopt};
    if (auto lost = lost_sandbox(sandbox_id, manager.config().node_id, manager.config().instance_id))
        return {ServiceError::ended, fmt::format("sandbox_lost: {}", lost->message), std::nullopt, lost->node};
    return {ServiceError::ended, fmt::format("sandbox {} is not running", sandbox_id), std::nullopt};
}

std::optional<std::pair<std::string, std::string>> sandbox_host(const std::string& host, const std::string& domain)
{
    std::string name = host.substr(0, host.rfind(':') == std::string::npos || host.back() == ']' ? host.size()
                                                                                                : host.rfind(':'));
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    std::string suffix = "." + domain;
    std::transform(suffix.begin(), suffix.end(), suffix.begin(), [](unsigned char c) { return std::tolower(c); });
    if (name.size() <= suffix.size() || !name.ends_with(suffix))
        return std::nullopt;
    const std::string label = name.substr(0, name.size() - suffix.size());
    const size_t dash = label.find('-');
    if (dash == 0 || dash == std::string::npos || label.find('.') != std::string::npos
        || label.find_first_not_of("0123456789") < dash)
        return std::nullopt;
    return std::pair{label.substr(0, dash), label.substr(dash + 1)};
}

} // namespace agentvm
