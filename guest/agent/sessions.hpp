// The sandbox's persistent sessions: its one bash (shell calls) and its interpreter contexts
// (run_code calls), each with the turns its calls take. They belong to the agent, not to a
// connection: a connection that ends leaves them running with their state (cwd, variables,
// background jobs), and the next connection finds them, as the host's does after a restore
// resets the vsock transport (a forked or resumed sandbox).
#pragma once

#include <signal.h>

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

    // list_processes: the process table's, then the persistent shell's bash (kind "shell") and
    // each context's interpreter (kind "context") while they run.
    Json list_processes()
    {
        Json entries = processes.list();
        if (const pid_t pid = shell.pid(); pid > 0)
            entries.push_back(Json{{"pid", pid}, {"tag", nullptr}, {"kind", "shell"}, {"running", true}});
        contexts.describe_processes(entries);
        return entries;
    }

    // The signal op: a process of the table, else the shell's bash or a context's interpreter
    // (SIGINT to an interpreter interrupts its cell). Throws CallError(not_found).
    void signal(const SignalRequest& request)
    {
        const int* pid = std::get_if<int>(&request.process);
        if (pid && *pid == shell.pid()) {
            ::kill(request.group ? -*pid : *pid, request.signal);
            return;
        }
        if (pid && contexts.signal(*pid, request.signal, request.group))
            return;
        processes.find(request.process)->signal(request.signal, request.group);
    }

    // From any thread, as the agent exits: neither session outlives it.
    void kill_on_exit() const
    {
        shell.kill_on_exit();
        contexts.kill_on_exit();
        processes.kill_on_exit();
    }
};

} // namespace agentvm
