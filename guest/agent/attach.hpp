// The attach call: follows a registered process's output from a connection that may not be
// the one that started it, from the oldest byte the process keeps (or from now on), and
// answers with how the process ended. Cancelling it (or the connection going away) only
// detaches: the process runs on.
#pragma once

#include "guest/agent/outbox.hpp"
#include "guest/agent/process_table.hpp"
#include "protocol/agent_protocol.hpp"

namespace agentvm {

// Bytes of events that may wait in the connection's queue before the attachment waits for
// its peer to read (the process meanwhile runs on; what the attachment misses is reported).
constexpr size_t attach_queue_limit = size_t{4} << 20;

// Sends the "attached" event and the output events, returns the final response. Throws
// CallError (not_found, limit).
Json attach_process(const Json& id, const AttachRequest& request, ProcessTable& processes, Outbox& outbox,
                    int cancel_fd);

} // namespace agentvm
