#include "guest/agent/shell.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "guest/agent/capture.hpp"
#include "guest/agent/child_setup.hpp"
#include "guest/agent/drain.hpp"
#include "common/error.hpp"

namespace agentvm {

namespace {

// For bash: the text inside single quotes, each ' closed, escaped and reopened.
std::string quote(std::string_view text)
{
    std::string quoted = "'";
    for (char c : text) {
        if (c == '\'')
            quoted += "'\\''";
        else
            quoted += c;
    }
    quoted += '\'';
    return quoted;
}

[[noreturn]] void fail(const std::string& what)
{
    throw CallError("spawn_failed", "shell: " + what + ": " + std::strerror(errno));
}

Fd open_fifo(const std::string& path)
{
    if (::mkfifo(path.c_str(), 0600) != 0)
        fail("mkfifo " + path);
    // Non-blocking: opening the read end must not wait for bash to open the other.
    Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    if (!fd)
        fail("open " + path);
    return fd;
}

void write_all(int fd, std::string_view text)
{
    while (!text.empty()) {
        const ssize_t n = ::write(fd, text.data(), text.size());
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            fail("write command");
        text.remove_prefix(static_cast<size_t>(n));
    }
}

// Reads bash's status FIFO during a call: the call's command is over when its "$?" line
// arrives. Bytes past that line stay in `pending` for the next call.
class StatusLine final : public Watch {
public:
    StatusLine(int fd, std::string& pending) : fd_(fd), pending_(pending) {}

    int fd() const override { return fd_; }
    short events() const override { return POLLIN; }
    bool ready(short revents) override
    {
        if (!(revents & POLLIN))
            return false;
        char buffer[64];
        const ssize_t got = ::read(fd_, buffer, sizeof(buffer));
        if (got > 0)
            pending_.append(buffer, static_cast<size_t>(got));
        const size_t newline = pending_.find('\n');
        if (newline == std::string::npos)
            return false;
        status = std::atoi(pending_.c_str());
        pending_.erase(0, newline + 1);
        return true;
    }

    std::optional<int> status;

private:
    int fd_;
    std::string& pending_;
};

} // namespace

Shell::~Shell()
{
    stop();
}

void Shell::start()
{
    // Under $TMPDIR when set, so a test can have an agent it kills leave nothing behind.
    const char* tmp = std::getenv("TMPDIR");
    std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/agentvm-shell.XXXXXX";
    if (!::mkdtemp(dir.data()))
        fail("mkdtemp");
    dir_ = dir;
    status_ = open_fifo(dir_ + "/status");

    ExecRequest bash;
    bash.argv = {"bash", "--noprofile", "--norc"};
    ChildPlan plan = plan_child(bash);
    cgroup_.emplace("shell");
    plan.cgroup_procs = cgroup_->procs_fd();
    int control[2];
    if (::pipe2(control, O_CLOEXEC) != 0)
        fail("pipe");
    Fd control_read(control[0]);
    control_ = Fd(control[1]);
    Fd null(::open("/dev/null", O_RDWR | O_CLOEXEC));
    int failure_pipe[2];
    if (!null || ::pipe2(failure_pipe, O_CLOEXEC) != 0)
        fail("/dev/null");
    Fd failure_read(failure_pipe[0]);
    Fd failure_write(failure_pipe[1]);

    pid_ = ::fork();
    if (pid_ < 0)
        fail("fork");
    if (pid_ == 0)
        exec_child(plan, control_read.get(), null.get(), null.get(), failure_write.get());
    failure_write.reset();
    ChildFailure failure{};
    if (::read(failure_read.get(), &failure, sizeof(failure)) > 0) {
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
        throw_child_failure(plan, failure);
    }
    pidfd_ = Fd(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
    if (!pidfd_) {
        const int err = errno;
        stop();
        errno = err;
        fail("pidfd_open");
    }
    write_all(control_.get(), "exec 3>" + quote(dir_ + "/status") + "\n");
}

void Shell::stop()
{
    if (pid_ > 0) {
        ::kill(-pid_, SIGKILL);
        while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
        }
    }
    // The session's jobs go with it, also those that left its process group.
    if (cgroup_)
        cgroup_->kill_all();
    pid_ = -1;
    pidfd_.reset();
    control_.reset();
    status_.reset();
    status_pending_.clear();
    cgroup_.reset();
    if (!dir_.empty()) {
        // Only FIFOs of ours live there; each call removes its own.
        ::unlink((dir_ + "/status").c_str());
        ::rmdir(dir_.c_str());
        dir_.clear();
    }
}

Json Shell::run(const Json& id, const ShellRequest& request, Outbox& outbox, int cancel_fd)
{
    // bash may have died between calls (a background job killed it): start afresh
    // rather than write to a dead pipe.
    if (pid_ > 0) {
        pollfd exited{pidfd_.get(), POLLIN, 0};
        if (::poll(&exited, 1, 0) > 0)
            stop();
    }
    if (pid_ < 0)
        start();
    const std::string n = std::to_string(++calls_);
    const std::string out_path = dir_ + "/out." + n;
    const std::string err_path = dir_ + "/err." + n;
    Capture captures[2] = {
        {"stdout", open_fifo(out_path), request.max_output, request.output_in_response},
        {"stderr", open_fifo(err_path), request.max_output, request.output_in_response},
    };

    const Clock::time_point start_time = Clock::now();
    try {
        write_all(control_.get(), "eval " + quote(request.cmd) + " >" + quote(out_path) + " 2>" + quote(err_path)
                + " </dev/null 3>&-; printf '%d\\n' \"$?\" >&3\n");
    } catch (const CallError&) {
        ::unlink(out_path.c_str());
        ::unlink(err_path.c_str());
        stop();
        throw;
    }

    StatusLine status_line(status_.get(), status_pending_);
    const Drained drained = drain({pid_, *cgroup_, pidfd_.get(), cancel_fd, deadline_after(start_time, request.timeout_s)},
                                  captures, status_line, id, request.stream, outbox);

    ::unlink(out_path.c_str());
    ::unlink(err_path.c_str());
    Json response{{"id", id}};
    if (drained.wait_status) {
        // bash is gone: `exit`, a timeout or a cancel. Its jobs go with it.
        const int wait_status = *drained.wait_status;
        pid_ = -1; // reaped: stop() must not wait for it again
        stop();
        const bool killed = WIFSIGNALED(wait_status);
        response["exit_code"] = killed ? Json(nullptr) : Json(WEXITSTATUS(wait_status));
        response["signal"] = killed ? Json(WTERMSIG(wait_status)) : Json(nullptr);
    } else {
        response["exit_code"] = *status_line.status;
        response["signal"] = nullptr;
    }
    response["timed_out"] = drained.timed_out;
    response["oom_killed"] = false;
    captures[0].put(response);
    captures[1].put(response);
    response["duration_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(drained.end - start_time).count();
    return response;
}

} // namespace agentvm
