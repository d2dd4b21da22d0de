// A cgroup of its own for each exec call and each shell session, made under the parent that
// init gives the agent (--call-cgroup; guest/calls_cgroup.hpp explains what the parent
// bounds and shares). The child process joins it before it execs (child_setup.hpp), so all
// it starts is in there too, and a timeout or a cancel kills all of it. A call's cgroup is
// removed once its last process has gone: at the end of the call, or, when background
// processes outlive the call, at a later call.
// Without a parent (the agent on a host, for tests) calls stay in the agent's own cgroup.
#pragma once

#include <optional>
#include <string>

#include "common/fd.hpp"

namespace agentvm {

class CallCgroup {
public:
    // At start-up, before any call. Throws Error if `dir` cannot be opened.
    static void set_parent(const std::optional<std::string>& dir);
    // Sets the parent's pids.max: how many processes and threads all calls may have at once.
    // Throws CallError(io) when it cannot, or when there is no parent.
    static void set_pids_max(uint32_t pids_max);

    // A fresh cgroup named "<kind>-<n>"; none without a parent. Throws
    // CallError(spawn_failed) when it cannot be made.
    explicit CallCgroup(const char* kind);
    // Removes it, or leaves it for a later call while processes remain in it.
    ~CallCgroup();
    CallCgroup(const CallCgroup&) = delete;
    CallCgroup& operator=(const CallCgroup&) = delete;

    // Its cgroup.procs, open for writing: a process that writes "0" there moves into it.
    // -1 without a parent.
    int procs_fd() const { return procs_.get(); }
    // SIGKILLs every process in it, those that left the call's process group (setsid)
    // included. Nothing without a parent.
    void kill_all() const;

private:
    std::string name_;
    Fd procs_;
    Fd kill_;  // its cgroup.kill
};

} // namespace agentvm
