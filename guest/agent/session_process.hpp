// The long-lived child behind the agent's shell (bash) and interpreter (python3): it
// reads one command at a time from a pipe on its stdin and reports each one's end as a line
// on a status FIFO, so the agent learns that a command finished without the child exiting.
// Each command's output goes to FIFOs made for it in the session's directory (under $TMPDIR),
// collected like an exec call's.
//
// The child runs in a process group and a cgroup of its own: a timeout or a cancel kills both,
// and the next call starts a fresh child, its state lost.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "guest/agent/call_cgroup.hpp"
#include "protocol/agent_protocol.hpp"
#include "common/fd.hpp"

namespace agentvm {

class SessionProcess {
public:
    // `kind` names the cgroup ("shell-N") and the directory (agentvm-<kind>.XXXXXX).
    explicit SessionProcess(const char* kind) : kind_(kind) {}
    ~SessionProcess() { stop(); }
    SessionProcess(const SessionProcess&) = delete;
    SessionProcess& operator=(const SessionProcess&) = delete;

    // Whether a child is running; one that has exited since (a background job killed it, the
    // code ended it) is stopped first.
    bool running();
    // Starts the child with `argv` (argv[0] looked up in PATH) in `cwd` (absent: the agent's),
    // stdin the command pipe, stdout and stderr /dev/null. The status FIFO exists
    // (status_path()) and is open for reading, for the child to open for writing. Throws
    // CallError(spawn_failed or not_found).
    void start(std::vector<std::string> argv, const std::optional<std::string>& cwd = std::nullopt);
    // Kills the child's process group and cgroup, reaps it, removes the directory.
    void stop();
    // The child was reaped by the caller (its exit ended a call): forget it, then stop().
    void reaped();
    // From any thread, as the agent exits: kills the child's process group, without waiting
    // or touching anything else, so no session outlives the agent.
    void kill_on_exit() const;

    // Writes a command to the child's stdin. Throws CallError(spawn_failed) when the child
    // does not take it (it is stopped then).
    void send(std::string_view text);

    // A FIFO in the session's directory for one command's output, open for reading
    // (non-blocking), for the child to open `path` for writing; removed when this goes.
    struct Fifo {
        Fifo(SessionProcess& session, const std::string& name);
        ~Fifo();
        Fifo(const Fifo&) = delete;
        Fifo& operator=(const Fifo&) = delete;

        std::string path;
        Fd fd;  // moved out to whoever reads it; the FIFO is still removed
    };
    std::string status_path() const { return dir_ + "/status"; }
    // Numbers the session's commands from 1.
    uint64_t next_command() { return ++commands_; }

    pid_t pid() const { return pid_; }
    // The running child's pid (its process group's), or -1: safe from any thread.
    pid_t group() const { return group_; }
    int pidfd() const { return pidfd_.get(); }
    const CallCgroup& cgroup() const { return *cgroup_; }
    int status_fd() const { return status_.get(); }
    // Bytes read from the status FIFO past the last complete status line.
    std::string& status_pending() { return status_pending_; }

private:
    Fd open_fifo(const std::string& path);

    const char* kind_;
    pid_t pid_ = -1;
    std::atomic<pid_t> group_{-1};  // pid_ for kill_on_exit(), which other threads call
    Fd pidfd_;
    Fd control_;  // the child's stdin
    Fd status_;   // read end of the status FIFO
    std::string status_pending_;
    std::string dir_;
    uint64_t commands_ = 0;
    std::optional<CallCgroup> cgroup_;
};

} // namespace agentvm
