// The make_dir, move and remove calls, answered on the connection's reading thread like the
// other file calls, with the call's user's file credentials (fs_user.hpp).
#pragma once

#include "protocol/agent_protocol.hpp"

namespace agentvm {

// Each returns the final response. Throws CallError: not_found, exists (make_dir: a
// non-directory in the way), not_empty (remove without recursive; move onto a non-empty
// directory), io.
Json make_dir(const Json& id, const MakeDirRequest& request);
Json move_path(const Json& id, const MoveRequest& request);
Json remove_path(const Json& id, const RemoveRequest& request);

} // namespace agentvm
