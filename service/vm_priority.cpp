#include "service/vm_priority.hpp"

#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace agentvm {
namespace {

constexpr const char* cgroup_root = "/sys/fs/cgroup";

// The cgroup v2 path of a process ("0::/agentvm/vm-123" -> "/agentvm/vm-123"), or "".
std::string unified_cgroup(pid_t pid)
{
    std::ifstream file(fmt::format("/proc/{}/cgroup", pid));
    for (std::string line; std::getline(file, line);) {
        if (line.starts_with("0::"))
            return line.substr(3);
    }
    return {};
}

} // namespace

bool cpu_weights_supported()
{
    return std::ifstream(fmt::format("{}/cgroup.controllers", cgroup_root)).good();
}

void restore_cpu_weight(pid_t episode)
{
    std::ifstream children_file(fmt::format("/proc/{}/task/{}/children", episode, episode));
    std::string children;
    std::getline(children_file, children);
    std::istringstream pids(children);
    for (pid_t child = 0; pids >> child;) {
        const std::string group = unified_cgroup(child);
        std::ofstream weight(fmt::format("{}{}/cpu.weight", cgroup_root, group));
        if (group.empty() || !(weight << default_cpu_weight << std::flush))
            spdlog::warn("cannot restore the CPU weight of VMM {} (cgroup '{}'): it keeps the pool's", child, group);
    }
}

} // namespace agentvm
