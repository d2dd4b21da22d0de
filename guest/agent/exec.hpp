// The exec call: runs argv in a session of its own with piped stdio, feeds stdin, collects
// (and optionally streams) stdout and stderr up to max_output each, enforces the timeout
// on the whole process group, reaps the child and builds the final response.
#pragma once

#include "guest/agent/outbox.hpp"
#include "guest/agent/process_table.hpp"
#include "protocol/agent_protocol.hpp"

namespace agentvm {

// Returns the final response. Throws CallError when the command cannot start (not_found,
// spawn_failed). When `cancel_fd` becomes readable (the connection went away) the process
// group is killed and the call ends early. The command is in `processes` while it runs (and
// a while after), where others may attach to it or signal it.
Json run_exec(const Json& id, const ExecRequest& request, Outbox& outbox, int cancel_fd, ProcessTable& processes);

} // namespace agentvm
