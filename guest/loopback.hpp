// The guest's only network interface for now: lo, so programs that talk to localhost work.
#pragma once

namespace agentvm {

// Sets lo up; the kernel then gives it 127.0.0.1/8 by itself. Warns on failure.
void bring_up_loopback();

} // namespace agentvm
