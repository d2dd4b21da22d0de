// What happens between fork and execve for an exec call. Everything that allocates (the
// environment, the PATH search, the C arrays) is done before fork in plan_child: the agent
// is multithreaded, so the child may only make async-signal-safe calls.
#pragma once

#include <string>
#include <vector>

#include "guest/agent/protocol.hpp"

namespace agentvm {

struct ChildPlan {
    std::string path; // argv[0] resolved through the call's PATH
    std::vector<std::string> argv;
    std::vector<std::string> env; // "NAME=value"
    std::string cwd;              // empty: the agent's
    std::vector<char*> c_argv;
    std::vector<char*> c_env;
};

// What a child that could not exec writes to the status pipe.
struct ChildFailure {
    int stage; // 0: chdir, 1: execve
    int error;
};

// Throws CallError(not_found) when argv[0] has no '/' and is not in PATH.
ChildPlan plan_child(const ExecRequest& request);

// In the forked child: a session of its own (so a timeout can kill the whole group),
// default SIGPIPE (the agent ignores it, and ignored signals survive execve), the given
// stdio, the cwd, then execve. On failure writes a ChildFailure to status_fd and exits 127.
[[noreturn]] void exec_child(ChildPlan& plan, int stdin_fd, int stdout_fd, int stderr_fd, int status_fd);

// Turns a ChildFailure into the CallError the call answers with.
[[noreturn]] void throw_child_failure(const ChildPlan& plan, const ChildFailure& failure);

} // namespace agentvm
