// agentvm's exit codes, one table so the CLI, the docs and the tests agree.
#pragma once

#include "vmm/vm.hpp"

namespace agentvm::exit_code {

inline constexpr int ok = 0;              // the guest powered off
inline constexpr int error = 1;           // host or set-up problem: missing file, no KVM, ...
inline constexpr int usage = 2;           // bad flag or argument
inline constexpr int guest_panic = 3;     // the guest kernel panicked
inline constexpr int vm_failure = 4;      // a vCPU or device failed while running
inline constexpr int episode_timed_out = 5;  // episode: its --episode-timeout ran out
inline constexpr int signal_base = 128;   // stopped by signal N: 128 + N

// agentvm run passes on the command's own status (0-255, 128+N for signal N), so its own
// outcomes take the codes timeout(1) and docker run made familiar.
inline constexpr int run_timed_out = 124;       // --timeout expired; the command was killed
inline constexpr int run_failure = 125;         // agentvm itself failed: usage, set-up, VM, agent
inline constexpr int run_cannot_execute = 126;  // the command exists but cannot be executed
inline constexpr int run_not_found = 127;       // no such command (or --workdir)

int from(const VmResult& result, int stop_signal);

} // namespace agentvm::exit_code
