#include "service/native/agent_ops.hpp"

#include <array>

namespace agentvm {
namespace {

constexpr std::array<AgentOp, 15> forwarded{{
    {"spawn"},
    {"attach", true},
    {"list_processes"},
    {"send_stdin"},
    {"close_stdin"},
    {"signal"},
    {"resize"},
    {"make_dir"},
    {"move"},
    {"remove"},
    {"watch", true},
    {"create_context"},
    {"list_contexts"},
    {"restart_context"},
    {"remove_context"},
}};

} // namespace

std::optional<AgentOp> forwarded_agent_op(std::string_view action)
{
    for (const AgentOp& op : forwarded)
        if (op.name == action)
            return op;
    return std::nullopt;
}

} // namespace agentvm
