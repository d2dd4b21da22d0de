// The agent's processes (docs/protocol.md, "Processes"): every exec call's command and every
// spawned one, from before it starts until a while after it ends, found by guest pid or by
// the tag its client gave it. Belongs to the agent, not a connection: a process started on
// one connection is reached from another (the host's, after a restore).
//
// Bounded: at most max_running() processes at once (a spawn or exec past it is refused
// `limit`), and of those that ended, the newest max_ended, each for ended_retention.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>

#include "guest/agent/process.hpp"
#include "protocol/agent_protocol.hpp"

namespace agentvm {

class ProcessTable {
public:
    static constexpr size_t default_max_running = 1024;
    static constexpr size_t max_ended = 256;

    // At start-up, before any call (the agent's --max-processes): how many may run at once.
    static void set_max_running(size_t count);
    static size_t max_running();
    static constexpr std::chrono::seconds ended_retention{600};

    // Registers a process about to start (listed once started). Throws CallError: `limit`
    // past max_running, `exists` for a tag a running process has.
    std::shared_ptr<Process> admit(ProcessKind kind, const ExecRequest& command, uint64_t replay_bytes);
    // A process admitted that did not start.
    void forget(const std::shared_ptr<Process>& process);

    // By pid, or by tag (the running one, else the one that ended last). Throws
    // CallError(not_found).
    std::shared_ptr<Process> find(const ProcessSelector& which);
    // list_processes: every started process, running or ended and kept, oldest first.
    Json list();
    // As the agent exits: every running process's group is killed.
    void kill_on_exit() const;

private:
    void prune();  // with mutex_ held

    mutable std::mutex mutex_;
    std::deque<std::shared_ptr<Process>> processes_;  // in the order they were admitted
};

// Forgets an admitted process unless dismissed: how a failed start leaves no entry behind.
class AdmittedProcess {
public:
    AdmittedProcess(ProcessTable& table, std::shared_ptr<Process> process)
        : table_(table), process_(std::move(process))
    {
    }
    ~AdmittedProcess()
    {
        if (process_)
            table_.forget(process_);
    }
    AdmittedProcess(const AdmittedProcess&) = delete;
    AdmittedProcess& operator=(const AdmittedProcess&) = delete;

    Process& operator*() const { return *process_; }
    Process* operator->() const { return process_.get(); }
    // It started: the table keeps it.
    std::shared_ptr<Process> keep() { return std::move(process_); }

private:
    ProcessTable& table_;
    std::shared_ptr<Process> process_;
};

} // namespace agentvm
