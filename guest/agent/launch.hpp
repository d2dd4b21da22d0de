// Starting a command the way exec and spawn do: fork, the child set up by exec_child
// (child_setup.hpp), and back only once execve has succeeded or its failure is known, with a
// pidfd that tells when the command exits.
#pragma once

#include <sys/types.h>

#include "guest/agent/child_setup.hpp"
#include "guest/agent/drain.hpp"
#include "guest/agent/process.hpp"
#include "common/fd.hpp"
#include "common/pipe.hpp"

namespace agentvm {

// common/pipe.hpp's, failing as a call does: CallError(spawn_failed).
Pipe make_call_pipe();

struct Launched {
    pid_t pid = -1;  // the leader of a session and process group of its own
    Fd pidfd;        // readable once it exits
};

// Forks and execs `plan` with the given stdio. Throws CallError (not_found, spawn_failed) when
// the command could not start; it has then been reaped.
Launched launch(ChildPlan& plan, int stdin_fd, int stdout_fd, int stderr_fd);

// The kernel's count of OOM kills, system-wide: a rise across a command's life, with the
// command dying of a SIGKILL the agent did not send, is how the agent learns the OOM killer hit it.
uint64_t oom_kill_count();

// How a drained command ended; `oom_kills_before` is oom_kill_count() from before it started.
ProcessEnd end_of(const Drained& drained, uint64_t oom_kills_before, Clock::time_point start);

} // namespace agentvm
