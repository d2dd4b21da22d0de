#include "guest/agent/session_process.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "guest/agent/child_setup.hpp"
#include "guest/agent/run_as.hpp"

namespace agentvm {

namespace {

[[noreturn]] void fail(const char* kind, const std::string& what)
{
    throw CallError("spawn_failed", std::string(kind) + ": " + what + ": " + std::strerror(errno));
}

} // namespace

bool SessionProcess::running()
{
    if (pid_ > 0) {
        pollfd exited{pidfd_.get(), POLLIN, 0};
        if (::poll(&exited, 1, 0) > 0)
            stop();
    }
    return pid_ > 0;
}

SessionProcess::Fifo::Fifo(SessionProcess& session, const std::string& name)
    : path(session.dir_ + "/" + name), fd(session.open_fifo(path))
{
}

SessionProcess::Fifo::~Fifo()
{
    ::unlink(path.c_str());
}

Fd SessionProcess::open_fifo(const std::string& path)
{
    if (::mkfifo(path.c_str(), 0600) != 0)
        fail(kind_, "mkfifo " + path);
    if (const int error = hand_over(path); error != 0) {
        errno = error;
        fail(kind_, "chown " + path);
    }
    // Non-blocking: opening the read end must not wait for the child to open the other.
    Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    if (!fd)
        fail(kind_, "open " + path);
    return fd;
}

void SessionProcess::start(std::vector<std::string> argv, const std::optional<std::string>& cwd)
{
    // Under $TMPDIR when set, so a test can have an agent it kills leave nothing behind.
    const char* tmp = std::getenv("TMPDIR");
    std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/agentvm-" + kind_ + ".XXXXXX";
    if (!::mkdtemp(dir.data()))
        fail(kind_, "mkdtemp");
    dir_ = dir;
    try {
        if (const int error = hand_over(dir_); error != 0) {
            errno = error;
            fail(kind_, "chown " + dir_);
        }
        status_ = open_fifo(status_path());

        ExecRequest request;
        request.argv = std::move(argv);
        request.cwd = cwd;
        ChildPlan plan = plan_child(request);
        cgroup_.emplace(kind_);
        plan.cgroup_procs = cgroup_->procs_fd();
        int control[2];
        if (::pipe2(control, O_CLOEXEC) != 0)
            fail(kind_, "pipe");
        Fd control_read(control[0]);
        control_ = Fd(control[1]);
        Fd null(::open("/dev/null", O_RDWR | O_CLOEXEC));
        int failure_pipe[2];
        if (!null || ::pipe2(failure_pipe, O_CLOEXEC) != 0)
            fail(kind_, "/dev/null");
        Fd failure_read(failure_pipe[0]);
        Fd failure_write(failure_pipe[1]);

        pid_ = ::fork();
        if (pid_ < 0)
            fail(kind_, "fork");
        if (pid_ == 0)
            exec_child(plan, control_read.get(), null.get(), null.get(), failure_write.get());
        failure_write.reset();
        ChildFailure failure{};
        if (::read(failure_read.get(), &failure, sizeof(failure)) > 0) {
            ::waitpid(pid_, nullptr, 0);
            pid_ = -1;
            throw_child_failure(plan, failure);
        }
        group_ = pid_;
        pidfd_ = Fd(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
        if (!pidfd_)
            fail(kind_, "pidfd_open");
    } catch (...) {
        stop();
        throw;
    }
}

void SessionProcess::kill_on_exit() const
{
    if (const pid_t group = group_; group > 0)
        ::kill(-group, SIGKILL);
}

void SessionProcess::stop()
{
    group_ = -1;
    if (pid_ > 0) {
        ::kill(-pid_, SIGKILL);
        while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
        }
    }
    // The session's background processes go with it, also those that left its process group.
    if (cgroup_)
        cgroup_->kill_all();
    pid_ = -1;
    pidfd_.reset();
    control_.reset();
    status_.reset();
    status_pending_.clear();
    cgroup_.reset();
    if (!dir_.empty()) {
        // Only FIFOs of ours live there: the status FIFO, and those of a command that ended
        // with the child (their Fifo objects, still alive in the call, find them gone).
        if (DIR* dir = ::opendir(dir_.c_str())) {
            while (const dirent* entry = ::readdir(dir))
                if (std::string_view(entry->d_name) != "." && std::string_view(entry->d_name) != "..")
                    ::unlinkat(::dirfd(dir), entry->d_name, 0);
            ::closedir(dir);
        }
        ::rmdir(dir_.c_str());
        dir_.clear();
    }
}

void SessionProcess::reaped()
{
    group_ = -1;
    pid_ = -1;
    stop();
}

void SessionProcess::send(std::string_view text)
{
    while (!text.empty()) {
        const ssize_t n = ::write(control_.get(), text.data(), text.size());
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            const int err = errno;
            stop();
            errno = err;
            fail(kind_, "write command");
        }
        text.remove_prefix(static_cast<size_t>(n));
    }
}

} // namespace agentvm
