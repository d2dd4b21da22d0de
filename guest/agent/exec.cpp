#include "guest/agent/exec.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "guest/agent/capture.hpp"
#include "guest/agent/child_setup.hpp"
#include "vmm/error.hpp"
#include "vmm/fd.hpp"

namespace agentvm {

namespace {

using Clock = std::chrono::steady_clock;

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

void kill_group(pid_t pgid)
{
    ::kill(-pgid, SIGKILL);
}

} // namespace

Json run_exec(const Json& id, const ExecRequest& request, Outbox& outbox, int cancel_fd)
{
    ChildPlan plan = plan_child(request);

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
        kill_group(pid);
        int ignored;
        while (::waitpid(pid, &ignored, 0) < 0 && errno == EINTR) {
        }
        throw CallError("spawn_failed", std::string("pidfd_open: ") + std::strerror(errno));
    }

    Capture captures[2] = {
        {"stdout", std::move(out.read), request.max_output},
        {"stderr", std::move(err.read), request.max_output},
    };
    std::string_view pending_stdin;
    if (request.stdin_data) {
        pending_stdin = *request.stdin_data;
        ::fcntl(in.write.get(), F_SETFL, ::fcntl(in.write.get(), F_GETFL) | O_NONBLOCK);
        if (pending_stdin.empty())
            in.write.reset();
    }

    std::optional<Clock::time_point> deadline;
    if (request.timeout_s)
        deadline = start + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(*request.timeout_s));

    bool exited = false;
    bool timed_out = false;
    bool cancelled = false;
    int wait_status = 0;
    Clock::time_point end{};
    Clock::time_point last_output{};

    for (;;) {
        const Clock::time_point now = Clock::now();
        if (exited) {
            const bool open = captures[0].open() || captures[1].open();
            if (!open || now - last_output >= quiet_after_exit || now - end >= drain_cap_after_exit)
                break;
        } else if (deadline && now >= *deadline && !timed_out) {
            timed_out = true;
            kill_group(pid);
        }

        pollfd fds[5];
        int count = 0;
        int index[2] = {-1, -1};
        for (int i = 0; i < 2; ++i)
            if (captures[i].open()) {
                index[i] = count;
                fds[count++] = {captures[i].fd(), POLLIN, 0};
            }
        int stdin_index = -1;
        if (in.write) {
            stdin_index = count;
            fds[count++] = {in.write.get(), POLLOUT, 0};
        }
        int pid_index = -1;
        if (!exited) {
            pid_index = count;
            fds[count++] = {pidfd.get(), POLLIN, 0};
        }
        int cancel_index = -1;
        if (!cancelled) {
            cancel_index = count;
            fds[count++] = {cancel_fd, POLLIN, 0};
        }

        int wait_ms = -1;
        if (exited)
            wait_ms = static_cast<int>(quiet_after_exit.count());
        else if (deadline && !timed_out)
            wait_ms = static_cast<int>(std::ceil(
                std::chrono::duration<double, std::milli>(*deadline - now).count()));
        if (::poll(fds, static_cast<nfds_t>(count), wait_ms) < 0 && errno != EINTR)
            throw_errno("poll");

        for (int i = 0; i < 2; ++i) {
            if (index[i] < 0 || fds[index[i]].revents == 0)
                continue;
            if (captures[i].read_some(id, request.stream, outbox))
                last_output = Clock::now();
        }
        if (stdin_index >= 0 && fds[stdin_index].revents != 0) {
            const ssize_t n = ::write(in.write.get(), pending_stdin.data(), pending_stdin.size());
            if (n > 0)
                pending_stdin.remove_prefix(static_cast<size_t>(n));
            // A command that does not read its stdin (EPIPE) simply does not get it.
            if (pending_stdin.empty() || (n < 0 && errno != EAGAIN && errno != EINTR))
                in.write.reset();
        }
        if (pid_index >= 0 && fds[pid_index].revents != 0) {
            while (::waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
            }
            exited = true;
            end = Clock::now();
            last_output = end;
            in.write.reset();
        }
        if (cancel_index >= 0 && fds[cancel_index].revents != 0) {
            cancelled = true;
            if (!exited)
                kill_group(pid);
        }
    }

    const bool killed = WIFSIGNALED(wait_status);
    Json response{{"id", id}};
    response["exit_code"] = killed ? Json(nullptr) : Json(WEXITSTATUS(wait_status));
    response["signal"] = killed ? Json(WTERMSIG(wait_status)) : Json(nullptr);
    response["timed_out"] = timed_out;
    response["oom_killed"] = killed && WTERMSIG(wait_status) == SIGKILL && !timed_out
        && !cancelled && read_oom_kills() > oom_before;
    captures[0].put(response);
    captures[1].put(response);
    response["duration_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(end - start).count();
    return response;
}

} // namespace agentvm
