#include "guest/agent/call_cgroup.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include "protocol/agent_protocol.hpp"
#include "common/error.hpp"

namespace agentvm {
namespace {

Fd parent;  // set once at start-up, before any call thread exists
std::atomic<uint64_t> next_number{0};
// Cgroups whose call has ended while processes of it still ran. Each holds a process, so
// pids.max bounds how many there can be.
std::mutex lingering_mutex;
std::vector<std::string> lingering;

bool remove_cgroup(const std::string& name)
{
    // EBUSY: still populated. Anything else (gone already) leaves nothing to retry.
    return ::unlinkat(parent.get(), name.c_str(), AT_REMOVEDIR) == 0 || errno != EBUSY;
}

} // namespace

void CallCgroup::set_parent(const std::optional<std::string>& dir)
{
    if (!dir)
        return;
    parent = Fd(::open(dir->c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!parent)
        throw_errno("open " + *dir);
}

void CallCgroup::set_pids_max(uint32_t pids_max)
{
    if (!parent)
        throw CallError("io", "setting pids.max: the agent runs calls in no cgroup of their own (no --call-cgroup)");
    const Fd file(::openat(parent.get(), "pids.max", O_WRONLY | O_CLOEXEC));
    const std::string text = std::to_string(pids_max);
    if (!file || ::write(file.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
        throw CallError("io", "setting the calls' pids.max to " + text + ": " + std::strerror(errno));
}

CallCgroup::CallCgroup(const char* kind)
{
    if (!parent)
        return;
    {
        std::lock_guard lock(lingering_mutex);
        std::erase_if(lingering, remove_cgroup);
    }
    const std::string name = std::string(kind) + "-" + std::to_string(next_number++);
    if (::mkdirat(parent.get(), name.c_str(), 0755) != 0)
        throw CallError("spawn_failed", "creating the call's cgroup " + name + ": " + std::strerror(errno));
    procs_ = Fd(::openat(parent.get(), (name + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
    kill_ = Fd(::openat(parent.get(), (name + "/cgroup.kill").c_str(), O_WRONLY | O_CLOEXEC));
    if (!procs_ || !kill_) {
        const int err = errno;
        procs_.reset();
        kill_.reset();
        ::unlinkat(parent.get(), name.c_str(), AT_REMOVEDIR);
        throw CallError("spawn_failed", "opening the call's cgroup " + name + ": " + std::strerror(err));
    }
    name_ = name;
}

void CallCgroup::kill_all() const
{
    // The kernel signals every process in the group at once, so none can fork its way out.
    if (kill_)
        while (::write(kill_.get(), "1", 1) < 0 && errno == EINTR) {
        }
}

CallCgroup::~CallCgroup()
{
    if (name_.empty())
        return;
    procs_.reset();
    kill_.reset();
    if (!remove_cgroup(name_)) {
        std::lock_guard lock(lingering_mutex);
        lingering.push_back(name_);
    }
}

} // namespace agentvm
