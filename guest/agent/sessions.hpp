// The sandbox's persistent sessions: its one bash (shell calls) and its interpreter contexts
// (run_code calls), each with the turns its calls take. They belong to the agent, not to a
// connection: a connection that ends leaves them running with their state (cwd, variables,
// background jobs), and the next connection finds them, as the host's does after a restore
// resets the vsock transport (a forked or resumed sandbox).
#pragma once

#include "guest/agent/contexts.hpp"
#include "guest/agent/process_table.hpp"
#include "guest/agent/shell.hpp"
#include "guest/agent/turns.hpp"

namespace agentvm {

struct Sessions {
    Shell shell;
    Turns shell_turns;
    Contexts contexts;
    ProcessTable processes;  // exec calls' commands and spawned processes

    // From any thread, as the agent exits: neither session outlives it.
    void kill_on_exit() const
    {
        shell.kill_on_exit();
        contexts.kill_on_exit();
        processes.kill_on_exit();
    }
};

} // namespace agentvm
