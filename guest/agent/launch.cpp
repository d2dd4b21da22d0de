#include "guest/agent/launch.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "protocol/agent_protocol.hpp"

namespace agentvm {
namespace {

void reap(pid_t pid)
{
    int ignored;
    while (::waitpid(pid, &ignored, 0) < 0 && errno == EINTR) {
    }
}

} // namespace

uint64_t oom_kill_count()
{
    // Not an ifstream: that would open without O_CLOEXEC and leak into a concurrent fork.
    Fd fd(::open("/proc/vmstat", O_RDONLY | O_CLOEXEC));
    if (!fd)
        return 0;
    std::string text(16384, '\0');
    size_t filled = 0;
    for (ssize_t n; (n = ::read(fd.get(), text.data() + filled, text.size() - filled)) > 0;)
        filled += static_cast<size_t>(n);
    text.resize(filled);
    const size_t at = text.find("\noom_kill ");
    return at == std::string::npos ? 0 : std::strtoull(text.c_str() + at + 10, nullptr, 10);
}

ProcessEnd end_of(const Drained& drained, uint64_t oom_kills_before, Clock::time_point start)
{
    // Only the command's exit ends its drain, so it has been reaped.
    const int wait_status = *drained.wait_status;
    ProcessEnd end;
    if (WIFSIGNALED(wait_status))
        end.signal = WTERMSIG(wait_status);
    else
        end.exit_code = WEXITSTATUS(wait_status);
    end.timed_out = drained.timed_out;
    end.oom_killed = end.signal == SIGKILL && !drained.timed_out && !drained.cancelled
        && oom_kill_count() > oom_kills_before;
    end.duration_ms = std::chrono::duration_cast<std::chrono::milliseconds>(drained.end - start).count();
    return end;
}

Pipe make_call_pipe()
{
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0)
        throw CallError("spawn_failed", std::string("pipe: ") + std::strerror(errno));
    return {Fd(fds[0]), Fd(fds[1])};
}

Launched launch(ChildPlan& plan, int stdin_fd, int stdout_fd, int stderr_fd)
{
    Pipe status = make_call_pipe();
    const pid_t pid = ::fork();
    if (pid < 0)
        throw CallError("spawn_failed", std::string("fork: ") + std::strerror(errno));
    if (pid == 0)
        exec_child(plan, stdin_fd, stdout_fd, stderr_fd, status.write.get());
    status.write.reset();

    // The status pipe closes on a successful execve (O_CLOEXEC); a failing child writes
    // what went wrong before exiting.
    ChildFailure failure{};
    ssize_t got;
    do
        got = ::read(status.read.get(), &failure, sizeof(failure));
    while (got < 0 && errno == EINTR);
    if (got > 0) {
        reap(pid);
        throw_child_failure(plan, failure);
    }

    Fd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    if (!pidfd) {
        // Without a pidfd nothing can notice the exit; never leave the child behind.
        const int error = errno;
        ::kill(-pid, SIGKILL);
        reap(pid);
        throw CallError("spawn_failed", std::string("pidfd_open: ") + std::strerror(error));
    }
    return {pid, std::move(pidfd)};
}

} // namespace agentvm
