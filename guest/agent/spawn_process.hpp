// The spawn op: a command started in the background, on a thread of its own that drains its
// output into its process-table entry (for attachments) and records how it ended. It outlives
// the request and the connection; its timeout, if it has one, kills it as exec's would.
#pragma once

#include "guest/agent/process_table.hpp"
#include "protocol/agent_protocol.hpp"

namespace agentvm {

// Returns the answer, {"id":…,"ok":true,"pid":N}, once the command runs. Throws CallError
// (not_found, spawn_failed, limit, exists) when it cannot start.
Json spawn_process(const Json& id, const SpawnRequest& request, ProcessTable& processes);

} // namespace agentvm
