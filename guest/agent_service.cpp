#include "guest/agent_service.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <utility>

#include "guest/console.hpp"
#include "guest/spawn.hpp"

namespace agentvm {
namespace {

constexpr char agent_path[] = "/sbin/agentvm-agent";
// The OOM killer's floor: never chosen. An agent killed for memory would take every
// running call with it, while the command that ate the memory survived.
constexpr int unkillable = -1000;

} // namespace

AgentService::AgentService(const std::optional<std::string>& call_cgroup, std::string workdir)
    : argv_{agent_path}, workdir_(std::move(workdir))
{
    if (call_cgroup) {
        argv_.push_back("--call-cgroup");
        argv_.push_back(*call_cgroup);
    }
}

void AgentService::start()
{
    if (::access(agent_path, X_OK) != 0) {
        say_errno(agent_path);
        return;
    }
    pid_ = start_daemon(argv_, workdir_.c_str(), unkillable);
}

void AgentService::on_reaped(pid_t pid, int wait_status)
{
    if (pid != pid_)
        return;
    pid_ = -1;
    report_exit("agent", wait_status);
    const auto now = std::chrono::steady_clock::now();
    while (!restarts_.empty() && now - restarts_.front() > restart_window)
        restarts_.pop_front();
    if (restarts_.size() >= max_restarts) {
        say("agent died %zu times in %lld s; not restarting it", restarts_.size() + 1,
            static_cast<long long>(restart_window.count()));
        return;
    }
    restarts_.push_back(now);
    start();
}

} // namespace agentvm
