#include "guest/agent/process_table.hpp"

#include <algorithm>

namespace agentvm {
namespace {

// Set once by main() before any thread runs; read only after.
size_t configured_max_running = ProcessTable::default_max_running;

} // namespace

void ProcessTable::set_max_running(size_t count)
{
    configured_max_running = count;
}

size_t ProcessTable::max_running()
{
    return configured_max_running;
}

std::shared_ptr<Process> ProcessTable::admit(ProcessKind kind, const ExecRequest& command, uint64_t replay_bytes)
{
    std::lock_guard lock(mutex_);
    prune();
    size_t running = 0;
    for (const auto& process : processes_) {
        if (!process->running())
            continue;
        ++running;
        if (command.tag && process->tag() == command.tag)
            throw CallError("exists", "a running process has the tag \"" + *command.tag + "\" (pid "
                                          + std::to_string(process->pid()) + ")");
    }
    if (running >= max_running())
        throw CallError("limit", std::to_string(max_running()) + " processes run already, the most the agent keeps");
    processes_.push_back(std::make_shared<Process>(kind, command, replay_bytes));
    return processes_.back();
}

void ProcessTable::forget(const std::shared_ptr<Process>& process)
{
    std::lock_guard lock(mutex_);
    std::erase(processes_, process);
}

std::shared_ptr<Process> ProcessTable::find(const ProcessSelector& which)
{
    std::lock_guard lock(mutex_);
    prune();
    std::shared_ptr<Process> found;
    for (const auto& process : processes_) {
        const pid_t pid = process->pid();
        if (pid == 0)
            continue;
        if (const int* wanted = std::get_if<int>(&which)) {
            // A pid may have been reused: the newest process that had it.
            if (pid == *wanted && (!found || process->running()))
                found = process;
        } else if (process->tag() == std::get<std::string>(which) && (!found || process->running())) {
            found = process;
        }
    }
    if (!found) {
        const int* pid = std::get_if<int>(&which);
        throw CallError("not_found", pid ? "no process " + std::to_string(*pid)
                                         : "no process tagged \"" + std::get<std::string>(which) + "\"");
    }
    return found;
}

Json ProcessTable::list()
{
    std::lock_guard lock(mutex_);
    prune();
    Json entries = Json::array();
    for (const auto& process : processes_)
        if (process->pid() != 0)
            entries.push_back(process->describe());
    return entries;
}

void ProcessTable::kill_on_exit() const
{
    std::lock_guard lock(mutex_);
    for (const auto& process : processes_)
        process->kill_group();
}

void ProcessTable::prune()
{
    const auto now = std::chrono::steady_clock::now();
    size_t ended = 0;
    // Newest first: the oldest ended ones past the count go, as do those kept long enough.
    for (auto it = processes_.rbegin(); it != processes_.rend();) {
        const auto& process = *it;
        if (process->running() || process->pid() == 0) {
            ++it;
            continue;
        }
        if (++ended > max_ended || now - process->ended_at() > ended_retention)
            it = std::make_reverse_iterator(processes_.erase(std::next(it).base()));
        else
            ++it;
    }
}

} // namespace agentvm
