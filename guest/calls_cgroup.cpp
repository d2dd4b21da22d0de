#include "guest/calls_cgroup.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "guest/console.hpp"

namespace agentvm {
namespace {

bool write_file(const std::string& path, const std::string& text)
{
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        say_errno(("open " + path).c_str());
        return false;
    }
    const ssize_t n = ::write(fd, text.data(), text.size());
    const int err = errno;
    ::close(fd);
    if (n != static_cast<ssize_t>(text.size())) {
        errno = n < 0 ? err : EIO;
        say_errno(("write " + text + " to " + path).c_str());
        return false;
    }
    return true;
}

} // namespace

std::optional<std::string> make_calls_cgroup(uint32_t pids_max)
{
    // The root cgroup may hold processes (init, the agent) and still hand controllers to its
    // children; any other cgroup cannot do both, which is why every call gets a child of
    // tool-calls and none runs in tool-calls itself.
    if (!write_file("/sys/fs/cgroup/cgroup.subtree_control", "+cpu +pids"))
        return std::nullopt;
    const std::string dir = calls_cgroup_path;
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
        say_errno(("mkdir " + dir).c_str());
        return std::nullopt;
    }
    if (!write_file(dir + "/pids.max", std::to_string(pids_max)) ||
        !write_file(dir + "/cgroup.subtree_control", "+cpu"))
        return std::nullopt;
    return dir;
}

} // namespace agentvm
