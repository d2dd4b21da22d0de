// The resume call: after a snapshot restore the guest's clock still shows the moment of the
// snapshot and its random-number generator holds the same state as every other clone. The
// host sends its time and fresh entropy; this puts both into the guest kernel. It also sends
// the episode's limit on the tool calls' processes, which may not be the baked one.
#pragma once

#include "protocol/agent_protocol.hpp"

namespace agentvm {

// Throws CallError(io) naming what failed.
void resume_guest(const ResumeRequest& request);

} // namespace agentvm
