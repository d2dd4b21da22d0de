#include "service/e2b/sandbox_route.hpp"

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

} // namespace agentvm
