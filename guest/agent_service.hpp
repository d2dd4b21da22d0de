// Keeps the tool-call agent (/sbin/agentvm-agent, listening on vsock) running for the life
// of the guest: init starts it before anything else runs and restarts it when it dies, so a
// tool call that kills the agent costs one failed call, not the episode. The agent is never
// the guest OOM killer's choice (oom_score_adj -1000; the commands it runs are not).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace agentvm {

class AgentService {
public:
    // call_cgroup: where the agent puts every tool call's processes (calls_cgroup.hpp);
    // workdir: the agent's working directory, which its tool calls inherit ("/" when missing).
    AgentService(const std::optional<std::string>& call_cgroup, std::string workdir);

    // Starts the agent; says why and carries on without it if it cannot.
    void start();
    // Called for every child init reaps: restarts the agent if that was it. An agent that
    // keeps dying at once is given up on, with one line saying so, rather than respawned
    // in a tight loop.
    void on_reaped(pid_t pid, int wait_status);
    // False once the agent is given up on (or could not start): nothing serves tool calls.
    bool running() const { return pid_ > 0; }

private:
    static constexpr size_t max_restarts = 5;
    static constexpr std::chrono::seconds restart_window{10};

    std::vector<std::string> argv_;
    std::string workdir_;
    pid_t pid_ = -1;
    std::deque<std::chrono::steady_clock::time_point> restarts_;
};

} // namespace agentvm
