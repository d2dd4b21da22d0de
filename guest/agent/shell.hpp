// The shell call: one persistent bash per agent (per sandbox), so cd, exports, functions and
// background jobs carry over from call to call, as in a terminal. A bash context's cells
// (contexts.hpp) run the same way, each context in a bash of its own. An image without bash in
// PATH gets `sh` instead (the lines below are POSIX), and each response then says "shell":"sh".
//
// bash reads commands from a pipe. Each call is sent as one line,
//   eval '<cmd>' >OUT 2>ERR </dev/null 3>&-; printf '%d\n' "$?" >&3
// where OUT and ERR are FIFOs made for the call and fd 3 is a FIFO that bash opened at
// start-up, so the agent learns when the command finished and its status without bash
// exiting. eval keeps a syntax error from wedging the shell; closing fd 3 for the command
// keeps background jobs from holding the status channel.
//
// A timeout, a cancel or a connection lost mid-call kills the shell's whole process group (no job
// control, so that is bash and everything it started); so does `exit`, by ending bash. The
// next call then starts a fresh shell, its state lost.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "guest/agent/outbox.hpp"
#include "guest/agent/session_process.hpp"
#include "protocol/agent_protocol.hpp"

namespace agentvm {

class Shell {
public:
    // `cwd`: where the shell starts; absent, the agent's.
    explicit Shell(std::optional<std::string> cwd = std::nullopt) : cwd_(std::move(cwd)) {}

    // Returns the final response (same shape as exec's). exit_code is bash's $?, so 128+N
    // for a command killed by signal N; signal is set only when bash itself was killed.
    // Throws CallError(spawn_failed) when neither bash nor sh can start.
    //
    // `env` (a bash cell's, run_code's "env"; names the shell can export) is exported for this
    // command alone: each name is put back afterwards as it was (unset when it was), whatever
    // the command did to it; a name that was set stays exported.
    Json run(const Json& id, const ShellRequest& request, Outbox& outbox, int cancel_fd,
             const std::map<std::string, std::string>& env = {});
    // The response of a call cancelled before its turn: it never ran, the shell is untouched.
    static Json not_run(const Json& id);
    // Throws CallError(bad_field) unless every name of `env` is one a shell can export: they
    // go into the shell's command line as they are.
    static void check_env(const std::map<std::string, std::string>& env);

    // Whether the shell runs (it has not ended since its last call), and ending it; not while a
    // call runs.
    bool running() { return bash_.running(); }
    void stop() { bash_.stop(); }

    // From any thread, as the agent exits (SessionProcess::kill_on_exit); also how a restart
    // ends a running cell.
    void kill_on_exit() const { bash_.kill_on_exit(); }
    // Its bash's pid while it runs, else -1; from any thread.
    pid_t pid() const { return bash_.group(); }

private:
    void start();

    std::optional<std::string> cwd_;
    SessionProcess bash_{"shell"};
    bool posix_sh_ = false;  // the session is sh: no bash in this image
};

} // namespace agentvm
