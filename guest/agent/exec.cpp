#include "guest/agent/exec.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "guest/agent/call_cgroup.hpp"
#include "guest/agent/capture.hpp"
#include "guest/agent/child_setup.hpp"
#include "guest/agent/drain.hpp"
#include "common/error.hpp"
#include "common/fd.hpp"

namespace agentvm {

namespace {

// The kernel counts OOM kills system-wide; a rise across the call, together with the
// child dying of SIGKILL we did not send, is how the call learns the OOM killer hit it.
uint64_t read_oom_kills()
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

struct Pipe {
    Fd read;
    Fd write;
};

Pipe make_pipe()
{
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0)
        throw CallError("spawn_failed", std::string("pipe: ") + std::strerror(errno));
    return {Fd(fds[0]), Fd(fds[1])};
}

// Feeds the call's stdin to the child as fast as the pipe takes it, never blocking the call,
// and closes the pipe once all is written or the child is gone: readers see end of file.
class StdinFeed final : public Watch {
public:
    StdinFeed(Fd pipe, std::string_view data) : pipe_(std::move(pipe)), pending_(data)
    {
        if (!pipe_)
            return;
        ::fcntl(pipe_.get(), F_SETFL, ::fcntl(pipe_.get(), F_GETFL) | O_NONBLOCK);
        if (pending_.empty())
            pipe_.reset();
    }

    int fd() const override { return pipe_.get(); }
    short events() const override { return POLLOUT; }
    bool ready(short) override
    {
        const ssize_t n = ::write(pipe_.get(), pending_.data(), pending_.size());
        if (n > 0)
            pending_.remove_prefix(static_cast<size_t>(n));
        // A command that does not read its stdin (EPIPE) simply does not get it.
        if (pending_.empty() || (n < 0 && errno != EAGAIN && errno != EINTR))
            pipe_.reset();
        return false;
    }
    void over() override { pipe_.reset(); }

private:
    Fd pipe_;
    std::string_view pending_;
};

} // namespace

Json run_exec(const Json& id, const ExecRequest& request, Outbox& outbox, int cancel_fd)
{
    ChildPlan plan = plan_child(request);
    // Outlives the child: removed once the call has reaped it (or later, see CallCgroup).
    const CallCgroup cgroup("exec");
    plan.cgroup_procs = cgroup.procs_fd();

    Pipe out = make_pipe();
    Pipe err = make_pipe();
    Pipe status = make_pipe();
    Pipe in;
    if (request.stdin_data) {
        in = make_pipe();
    } else {
        in.read = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
        if (!in.read)
            throw CallError("spawn_failed", std::string("/dev/null: ") + std::strerror(errno));
    }

    const uint64_t oom_before = read_oom_kills();
    const Clock::time_point start = Clock::now();
    const pid_t pid = ::fork();
    if (pid < 0)
        throw CallError("spawn_failed", std::string("fork: ") + std::strerror(errno));
    if (pid == 0)
        exec_child(plan, in.read.get(), out.write.get(), err.write.get(), status.write.get());

    in.read.reset();
    out.write.reset();
    err.write.reset();
    status.write.reset();
    // The status pipe closes on a successful execve (O_CLOEXEC); a failing child writes
    // what went wrong before exiting.
    ChildFailure failure{};
    ssize_t got;
    do
        got = ::read(status.read.get(), &failure, sizeof(failure));
    while (got < 0 && errno == EINTR);
    if (got > 0) {
        int ignored;
        while (::waitpid(pid, &ignored, 0) < 0 && errno == EINTR) {
        }
        throw_child_failure(plan, failure);
    }

    Fd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    if (!pidfd) {
        // Without a pidfd the loop cannot notice the exit; never leave the child behind.
        ::kill(-pid, SIGKILL);
        int ignored;
        while (::waitpid(pid, &ignored, 0) < 0 && errno == EINTR) {
        }
        throw CallError("spawn_failed", std::string("pidfd_open: ") + std::strerror(errno));
    }

    Capture captures[2] = {
        {"stdout", std::move(out.read), request.max_output, request.output_in_response},
        {"stderr", std::move(err.read), request.max_output, request.output_in_response},
    };
    StdinFeed feed(std::move(in.write), request.stdin_data ? std::string_view(*request.stdin_data) : "");
    const Drained drained = drain({pid, cgroup, pidfd.get(), cancel_fd, deadline_after(start, request.timeout_s)}, captures,
                                  feed, id, request.stream, outbox);

    // Only the child's exit ends an exec call, so it has been reaped.
    const int wait_status = *drained.wait_status;
    const bool killed = WIFSIGNALED(wait_status);
    Json response{{"id", id}};
    response["exit_code"] = killed ? Json(nullptr) : Json(WEXITSTATUS(wait_status));
    response["signal"] = killed ? Json(WTERMSIG(wait_status)) : Json(nullptr);
    response["timed_out"] = drained.timed_out;
    response["oom_killed"] = killed && WTERMSIG(wait_status) == SIGKILL && !drained.timed_out
        && !drained.cancelled && read_oom_kills() > oom_before;
    put_outcome(response, drained, captures, start);
    return response;
}

} // namespace agentvm
