// What happens between fork and execve for an exec call. Everything that allocates (the
// environment, the PATH search, the C arrays) is done before fork in plan_child: the agent
// is multithreaded, so the child may only make async-signal-safe calls.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "protocol/agent_protocol.hpp"
#include "protocol/image_defaults.hpp"

namespace agentvm {

struct ChildPlan {
    std::string path; // argv[0] resolved through the call's PATH
    std::vector<std::string> argv;
    std::vector<std::string> env; // "NAME=value"
    std::string cwd;              // empty: the agent's
    std::optional<ImageUser> user; // the call's "user", whose credentials replace the image's
    int cgroup_procs = -1;        // the call's CallCgroup::procs_fd(), joined first
    bool controlling_tty = false; // stdin is a pseudo-terminal's slave: make it the session's
    std::vector<char*> c_argv;
    std::vector<char*> c_env;
};

// What a child that could not exec writes to the status pipe.
struct ChildFailure {
    int stage; // 0: chdir, 1: execve, 2: joining the call's cgroup, 3: oom_score_adj, 4: the user's credentials
    int error;
};

// Set once at start-up, before any call runs: calls get cgroups of their own under
// `cgroup_parent` (the agent's --call-cgroup; see call_cgroup.hpp); and since they would
// inherit the agent's own protection from the OOM killer, they drop it (oom_score_adj 0)
// whenever the agent has one. Throws Error if the parent cannot be opened.
void confine_calls(const std::optional<std::string>& cgroup_parent);

// With the request's "user": its credentials, HOME, USER and LOGNAME (the request's env
// still wins) and, without a "cwd", its home as the cwd. Throws CallError: not_found when
// argv[0] has no '/' and is not in PATH, bad_field when the guest has no such user.
ChildPlan plan_child(const ExecRequest& request);

// In the forked child: the call's cgroup (plan.cgroup_procs) and oom_score_adj
// (confine_calls), a session of its own (so a timeout can kill the whole group), default SIGPIPE (the agent ignores it, and
// ignored signals survive execve), the given stdio, the call's user or else the image's
// (run_as.hpp), the cwd,
// then execve. On failure writes a
// ChildFailure to status_fd and exits 127.
[[noreturn]] void exec_child(ChildPlan& plan, int stdin_fd, int stdout_fd, int stderr_fd, int status_fd);

// Turns a ChildFailure into the CallError the call answers with.
[[noreturn]] void throw_child_failure(const ChildPlan& plan, const ChildFailure& failure);

} // namespace agentvm
