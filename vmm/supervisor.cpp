#include "vmm/supervisor.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "common/fd.hpp"
#include "vmm/jail.hpp"

namespace agentvm {
namespace {

using Clock = std::chrono::steady_clock;

sigset_t supervisor_signals()
{
    sigset_t set;
    sigemptyset(&set);
    for (const int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP})
        sigaddset(&set, sig);
    return set;
}

[[noreturn]] void child_failed(const char* what)
{
    // Before the VMM's own error reporting exists: one line, then the status a failure gets.
    const std::string line = fmt::format("agentvm: error: starting the VMM: {}: {}\n", what, std::strerror(errno));
    [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, line.data(), line.size());
    ::_exit(1);
}

// The child's first steps. `parent` is its end of a socket pair whose other end only the
// parent holds open: once PR_SET_PDEATHSIG is set, a parent that died before can be seen by
// its end being closed; the parent writes a byte to it once it has moved the child into its
// cgroup.
void enter_child(const Supervision& supervision, Fd parent)
{
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
        child_failed("PR_SET_PDEATHSIG");
    pollfd hangup{parent.get(), 0, 0};
    if (::poll(&hangup, 1, 0) < 0 || (hangup.revents & POLLHUP) != 0)
        ::_exit(1);
    const int kept = close_inherited_fds(parent.release());
    if (supervision.cgroup) {
        supervision.cgroup->disown();
        // A copy: the link itself stays open for the VMM's life (lock_down() watches it).
        Fd joined(::fcntl(kept, F_DUPFD_CLOEXEC, kept + 1));
        if (!joined)
            child_failed("keeping the supervisor's link");
        supervision.cgroup->await_join(std::move(joined));
    }
    // SIGINT, SIGTERM and SIGHUP stay blocked until the VMM takes them through its signalfd
    // (episode/stop_signals.hpp): as PID 1 of its namespace it would ignore them otherwise, and
    // one passed on early stays pending. It has no children to hear of.
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_UNBLOCK, &chld, nullptr);
}

int status_of(int status, const Supervision& supervision, bool killed_at_deadline)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    const int sig = WTERMSIG(status);
    if (killed_at_deadline)
        spdlog::error("the VMM did not stop at the end of its time limit and was killed");
    else if (supervision.cgroup && supervision.cgroup->memory_limit_hit())
        spdlog::error("the VMM was killed by the kernel: it reached its memory limit (--vmm-mem)");
    else
        spdlog::error("the VMM was killed by signal {} ({})", sig, strsignal(sig));
    return supervision.killed_code ? supervision.killed_code : 128 + sig;
}

} // namespace

int supervise(const Supervision& supervision, const std::function<int()>& vmm)
{
    const sigset_t set = supervisor_signals();
    sigset_t old;
    sigprocmask(SIG_BLOCK, &set, &old);
    // A socket pair, not a pipe: the VMM may be gone before the parent writes to it (a restore
    // of a tiny guest, a VMM that fails at once), and send() can say so without a SIGPIPE.
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
        throw_errno("creating the supervisor's socket pair");
    Fd child_end(pair[0]);
    Fd parent_end(pair[1]);
    if (::unshare(CLONE_NEWPID) != 0)
        throw_errno("jail: creating the VMM's PID namespace");
    const auto started = Clock::now();
    const pid_t child = ::fork();
    if (child < 0)
        throw_errno("starting the VMM process");
    if (child == 0) {
        parent_end.reset();
        enter_child(supervision, std::move(child_end));
        return vmm();
    }
    child_end.reset();
    if (supervision.cgroup) {
        try {
            supervision.cgroup->add(child);
        } catch (...) {
            ::kill(child, SIGKILL);
            ::waitpid(child, nullptr, 0);
            throw;
        }
        // The VMM waits for this before its guest memory is first written. EPIPE: it has
        // ended already, and its status says how.
        const char joined = 1;
        if (::send(parent_end.get(), &joined, 1, MSG_NOSIGNAL) != 1 && errno != EPIPE)
            throw_errno("telling the VMM it is in its cgroup");
    }
    bool killed_at_deadline = false;
    for (;;) {
        timespec wait{};
        if (supervision.hard_deadline && !killed_at_deadline) {
            const auto left = *supervision.hard_deadline - (Clock::now() - started);
            if (left <= Clock::duration::zero()) {
                ::kill(child, SIGKILL);
                killed_at_deadline = true;
                continue;
            }
            const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(left).count();
            wait = {static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1000000};
        } else {
            wait = {3600, 0};
        }
        siginfo_t info{};
        const int sig = ::sigtimedwait(&set, &info, &wait);
        if (sig < 0 && errno != EAGAIN && errno != EINTR)
            throw_errno("supervisor: waiting for signals");
        if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
            ::kill(child, sig);
            continue;
        }
        int status = 0;
        const pid_t done = ::waitpid(child, &status, WNOHANG);
        if (done == child) {
            sigprocmask(SIG_SETMASK, &old, nullptr);
            return status_of(status, supervision, killed_at_deadline);
        }
    }
}

} // namespace agentvm
