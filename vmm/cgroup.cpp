#include "vmm/cgroup.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <thread>
#include <utility>

#include <cstdlib>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/cgroup_parent.hpp"
#include "common/error.hpp"
#include "common/fd.hpp"

namespace agentvm {
namespace {

constexpr const char* cgroup_root = "/sys/fs/cgroup";
constexpr const char* controllers[] = {"cpu", "memory", "pids"};
// The CFS period the quota is a share of: the kernel's default.
constexpr uint64_t cpu_period_us = 100000;
// A VMM's group is empty once the process has been reaped, but the kernel may still be
// finishing its io_uring workers; rmdir says EBUSY until it has.
constexpr auto removal_patience = std::chrono::seconds(2);
// A group left by a supervisor that was itself SIGKILLed is removed by the next VM's
// supervisor once it is this old (and empty, and its supervisor's pid gone): younger groups
// may belong to a supervisor in another PID namespace that has not moved its VMM in yet.
constexpr auto stale_age = std::chrono::minutes(1);

// A write failing with `tolerated` (0: none) is no error.
void write_file(const std::string& path, const std::string& text, int tolerated = 0)
{
    Fd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd)
        throw_errno(fmt::format("cgroup: opening '{}'", path));
    if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) &&
        (tolerated == 0 || errno != tolerated))
        throw_errno(fmt::format("cgroup: writing '{}' to '{}'", text, path));
}

std::string read_file(const std::string& path)
{
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

bool exists(const std::string& path)
{
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
}

void make_dir(const std::string& path, bool may_exist)
{
    if (::mkdir(path.c_str(), 0755) != 0 && !(may_exist && errno == EEXIST))
        throw_errno(fmt::format("cgroup: creating '{}'", path));
}

// The calling process's group in the v1 hierarchy holding `controller`, from /proc/self/cgroup
// ("<id>:<controllers, comma-separated>:<path>" per hierarchy).
std::string own_v1_path(const std::string& controller)
{
    std::ifstream in("/proc/self/cgroup");
    for (std::string line; std::getline(in, line);) {
        const size_t first = line.find(':');
        const size_t second = line.find(':', first + 1);
        if (first == std::string::npos || second == std::string::npos)
            continue;
        std::stringstream names(line.substr(first + 1, second - first - 1));
        for (std::string name; std::getline(names, name, ',');)
            if (name == controller)
                return line.substr(second + 1);
    }
    throw Error(fmt::format("cgroup: this host's cgroup v1 has no '{}' controller (see /proc/self/cgroup); "
                            "--cpu-quota 0 --vmm-mem 0 run without cgroup limits",
                            controller));
}

void enable_v2_controllers(const std::string& dir)
{
    const std::string available = read_file(dir + "/cgroup.controllers");
    for (const char* controller : controllers) {
        if (available.find(controller) == std::string::npos)
            throw Error(fmt::format("cgroup: the '{}' controller is not available in '{}'", controller, dir));
        write_file(dir + "/cgroup.subtree_control", fmt::format("+{}", controller));
    }
}

// "oom_kill <count>" in memory.events (v2) or memory.oom_control (v1).
uint64_t oom_kills(const std::string& path)
{
    std::istringstream text(read_file(path));
    std::string key;
    uint64_t value = 0;
    while (text >> key >> value)
        if (key == "oom_kill")
            return value;
    return 0;
}

// Whether a process with this pid exists in our PID namespace.
bool process_exists(pid_t pid)
{
    return ::kill(pid, 0) == 0 || errno == EPERM;
}

// Removes the groups in `parent` named <prefix><pid> whose supervisor is gone: empty (rmdir
// refuses any other), older than stale_age, and no process with that pid.
void remove_stale_groups(const std::string& parent, std::string_view prefix)
{
    std::error_code error;
    const auto now = std::chrono::system_clock::now();
    for (const auto& entry : std::filesystem::directory_iterator(parent, error)) {
        const std::string name = entry.path().filename();
        if (!name.starts_with(prefix))
            continue;
        pid_t pid = 0;
        const char* digits = name.data() + prefix.size();
        const auto [end, ec] = std::from_chars(digits, name.data() + name.size(), pid);
        if (ec != std::errc{} || end != name.data() + name.size() || pid <= 0 || process_exists(pid))
            continue;
        struct stat st {};
        if (::stat(entry.path().c_str(), &st) != 0 ||
            now - std::chrono::system_clock::from_time_t(st.st_mtime) < stale_age)
            continue;
        if (::rmdir(entry.path().c_str()) == 0)
            spdlog::info("cgroup: removed '{}', left by a supervisor that is gone", entry.path().string());
    }
}

} // namespace

VmCgroup VmCgroup::create()
{
    const std::string name = fmt::format("{}", ::getpid());
    if (exists(fmt::format("{}/cgroup.controllers", cgroup_root))) {
        std::string parent = fmt::format("{}/agentvm", cgroup_root);
        if (const char* delegated = std::getenv(cgroup_parent_variable); delegated && *delegated) {
            parent = delegated;
            if (!parent.starts_with(std::string(cgroup_root) + "/") || parent.find("/..") != std::string::npos)
                throw Error(fmt::format("cgroup: {}='{}' is not a directory under {}", cgroup_parent_variable, parent,
                                        cgroup_root));
        } else {
            enable_v2_controllers(cgroup_root);
            make_dir(parent, true);
        }
        enable_v2_controllers(parent);
        remove_stale_groups(parent, "vm-");
        const std::string dir = fmt::format("{}/vm-{}", parent, name);
        make_dir(dir, false);
        return VmCgroup(true, {dir});
    }
    if (!exists(fmt::format("{}/memory", cgroup_root)))
        throw Error(fmt::format("cgroup: no cgroup filesystem under {} (neither v2 nor v1 with a memory controller); "
                                "--cpu-quota 0 --vmm-mem 0 run without cgroup limits",
                                cgroup_root));
    VmCgroup made(false, {});
    for (const char* controller : controllers) {
        std::string own = own_v1_path(controller);
        if (own == "/")
            own.clear();
        remove_stale_groups(fmt::format("{}/{}{}", cgroup_root, controller, own), "agentvm-");
        const std::string dir = fmt::format("{}/{}{}/agentvm-{}", cgroup_root, controller, own, name);
        make_dir(dir, false);
        made.dirs_.push_back(dir);
    }
    return made;
}

VmCgroup::VmCgroup(VmCgroup&& other) noexcept
    : unified_(other.unified_),
      dirs_(std::move(other.dirs_)),
      owned_(std::exchange(other.owned_, false)),
      joined_(std::move(other.joined_))
{
}

VmCgroup::~VmCgroup()
{
    if (owned_)
        remove();
}

std::string VmCgroup::dir_for(const char* controller) const
{
    if (unified_)
        return dirs_.front();
    for (size_t i = 0; i < std::size(controllers); ++i)
        if (std::string_view(controllers[i]) == controller)
            return dirs_.at(i);
    throw Error(fmt::format("cgroup: no group for controller '{}'", controller));
}

void VmCgroup::add(pid_t pid) const
{
    // ESRCH: the process has ended already (a VMM that failed at once); its status tells.
    for (const auto& dir : dirs_)
        write_file(dir + "/cgroup.procs", fmt::format("{}", pid), ESRCH);
}

void VmCgroup::wait_joined()
{
    if (!joined_)
        return;
    char done = 0;
    ssize_t n;
    while ((n = ::read(joined_.get(), &done, 1)) < 0 && errno == EINTR) {
    }
    joined_.reset();
    if (n != 1)
        throw Error("the supervisor could not move the VMM into its cgroup");
}

void VmCgroup::limit(const CgroupLimits& limits) const
{
    if (limits.cpu_cores > 0) {
        const auto quota_us = static_cast<uint64_t>(std::llround(limits.cpu_cores * cpu_period_us));
        if (unified_) {
            write_file(dir_for("cpu") + "/cpu.max", fmt::format("{} {}", quota_us, cpu_period_us));
        } else {
            write_file(dir_for("cpu") + "/cpu.cfs_period_us", fmt::format("{}", cpu_period_us));
            write_file(dir_for("cpu") + "/cpu.cfs_quota_us", fmt::format("{}", quota_us));
        }
    }
    if (limits.memory_bytes > 0)
        write_file(dir_for("memory") + (unified_ ? "/memory.max" : "/memory.limit_in_bytes"),
                   fmt::format("{}", limits.memory_bytes));
    if (limits.max_pids > 0)
        write_file(dir_for("pids") + "/pids.max", fmt::format("{}", limits.max_pids));
    if (limits.cpu_weight > 0) {
        if (unified_)
            write_file(dir_for("cpu") + "/cpu.weight", fmt::format("{}", limits.cpu_weight));
        else  // v1's cpu.shares: 1024 is v2's 100
            write_file(dir_for("cpu") + "/cpu.shares", fmt::format("{}", std::max(2u, limits.cpu_weight * 1024 / 100)));
    }
}

bool VmCgroup::memory_limit_hit() const
{
    return oom_kills(dir_for("memory") + (unified_ ? "/memory.events" : "/memory.oom_control")) > 0;
}

void VmCgroup::remove()
{
    const auto deadline = std::chrono::steady_clock::now() + removal_patience;
    for (const auto& dir : dirs_) {
        while (::rmdir(dir.c_str()) != 0 && errno != ENOENT) {
            if (errno != EBUSY || std::chrono::steady_clock::now() > deadline) {
                spdlog::warn("cgroup: cannot remove '{}': {}", dir, std::strerror(errno));
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    }
}

} // namespace agentvm
