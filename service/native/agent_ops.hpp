// The agent ops the native API forwards as they are (docs/api.md, "Processes, files and
// contexts"): POST /v1/sandboxes/{id}/{op} with the op's fields as the body, answered with
// the agent's answer. The host's own ops (env, resume, snapshot, close) are never among them.
#pragma once

#include <optional>
#include <string_view>

namespace agentvm {

struct AgentOp {
    std::string_view name;
    // A call that follows something until cancelled (attach, watch): always answered as an
    // NDJSON stream, and cancelled in the guest when its client goes away.
    bool follows = false;
};

std::optional<AgentOp> forwarded_agent_op(std::string_view action);

} // namespace agentvm
