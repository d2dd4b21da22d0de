#include "service/systemd/delegated_cgroup.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/cgroup_parent.hpp"
#include "common/error.hpp"
#include "common/fd.hpp"

namespace agentvm {
namespace {

constexpr const char* delegated_root = "/sys/fs/cgroup";
// VMMs' groups are vm-<pid> (vmm/cgroup.cpp), so this name cannot meet one of theirs.
constexpr const char* serve_leaf = "serve";

void write_cgroup_file(const std::string& path, const std::string& text)
{
    Fd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd || ::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
        throw_errno(fmt::format("--delegated-cgroup: writing '{}' to {} (is the cgroup delegated to serve's user: "
                                "Delegate=yes?)", text, path));
}

// This process's cgroup v2 path ("/system.slice/agentvm-serve.service").
std::string own_unified_cgroup()
{
    std::ifstream file("/proc/self/cgroup");
    for (std::string line; std::getline(file, line);)
        if (line.starts_with("0::"))
            return line.substr(3);
    throw Error("--delegated-cgroup: /proc/self/cgroup names no cgroup v2 group");
}

} // namespace

void enter_delegated_cgroup()
{
    struct stat st {};
    if (::stat(fmt::format("{}/cgroup.controllers", delegated_root).c_str(), &st) != 0)
        return;
    std::string own = own_unified_cgroup();
    // Serve started again in the same group (Restart=) is still in it; one whose previous run
    // moved it into the leaf already (a restart by hand within the group) stays there.
    const std::string leaf_suffix = std::string("/") + serve_leaf;
    if (own.ends_with(leaf_suffix))
        own.resize(own.size() - leaf_suffix.size());
    const std::string parent = std::string(delegated_root) + (own == "/" ? "" : own);
    const std::string leaf = parent + leaf_suffix;
    if (::mkdir(leaf.c_str(), 0755) != 0 && errno != EEXIST)
        throw_errno(fmt::format("--delegated-cgroup: creating {} (is the cgroup delegated to serve's user: "
                                "Delegate=yes?)", leaf));
    write_cgroup_file(leaf + "/cgroup.procs", "0");
    for (const char* controller : {"cpu", "memory", "pids"})
        write_cgroup_file(parent + "/cgroup.subtree_control", fmt::format("+{}", controller));
    if (::setenv(cgroup_parent_variable, parent.c_str(), 1) != 0)
        throw_errno("--delegated-cgroup: setenv");
    spdlog::info("VMs' cgroups go under {} (serve's delegated cgroup; serve itself in {})", parent, leaf);
}

} // namespace agentvm
