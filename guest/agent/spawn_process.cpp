#include "guest/agent/spawn_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>

#include "guest/agent/call_cgroup.hpp"
#include "guest/agent/capture.hpp"
#include "guest/agent/drain.hpp"
#include "guest/agent/launch.hpp"
#include "guest/agent/run_as.hpp"

namespace agentvm {
namespace {

[[noreturn]] void spawn_failed(const char* what)
{
    throw CallError("spawn_failed", std::string(what) + ": " + std::strerror(errno));
}

Fd open_or_fail(const char* path, int flags)
{
    Fd fd(::open(path, flags | O_CLOEXEC));
    if (!fd)
        spawn_failed(path);
    return fd;
}

Fd duplicate(const Fd& fd)
{
    Fd copy(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
    if (!copy)
        spawn_failed("dup");
    return copy;
}

struct Pty {
    Fd master;
    Fd slave;
};

// Both ends close-on-exec from the start (openpty's are not, and another thread may fork).
// `owner`: who runs the command (nullopt: root), whose terminal it must be to open it again.
Pty open_pty(const PtySize& size, const std::optional<ImageUser>& owner)
{
    Pty pty;
    pty.master = Fd(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!pty.master)
        spawn_failed("posix_openpt");
    char name[128];
    if (::grantpt(pty.master.get()) != 0 || ::unlockpt(pty.master.get()) != 0
        || ::ptsname_r(pty.master.get(), name, sizeof(name)) != 0)
        spawn_failed("pty");
    pty.slave = open_or_fail(name, O_RDWR | O_NOCTTY);
    if (owner)
        [[maybe_unused]] int ignored = ::fchown(pty.slave.get(), owner->uid, owner->gid);
    const winsize window{size.rows, size.cols, 0, 0};
    if (::ioctl(pty.master.get(), TIOCSWINSZ, &window) != 0)
        spawn_failed("pty size");
    return pty;
}

// What the drain thread owns while the command runs.
struct Background {
    std::shared_ptr<Process> process;
    std::unique_ptr<CallCgroup> cgroup;
    pid_t pid;
    Fd pidfd;
    std::array<Capture, 2> captures;
    std::shared_ptr<ProcessStdin> stdin_feed;
    std::optional<double> timeout_s;
    uint64_t oom_before;
    Clock::time_point start;
};

// Stands for a stdin that nothing feeds: nothing to watch.
class NoStdin final : public Watch {
public:
    int fd() const override { return -1; }
    short events() const override { return 0; }
    bool ready(short) override { return false; }
};

void drain_until_end(Background running)
{
    NoStdin no_stdin;
    Watch& watch = running.stdin_feed ? static_cast<Watch&>(*running.stdin_feed) : no_stdin;
    ProcessEnd end;
    try {
        const Drained drained = drain_quietly({running.pid, *running.cgroup, running.pidfd.get(), -1,
                                               deadline_after(running.start, running.timeout_s)},
                                              running.captures, watch);
        end = end_of(drained, running.oom_before, running.start);
    } catch (const std::exception& e) {
        // poll() failing is the only way here: never leave the command unwatched.
        std::fprintf(stderr, "agentvm-agent: process %d: %s\n", running.pid, e.what());
        ::kill(-running.pid, SIGKILL);
        running.cgroup->kill_all();
        int status = 0;
        while (::waitpid(running.pid, &status, 0) < 0 && errno == EINTR) {
        }
        end.signal = SIGKILL;
    }
    running.process->finish(end);
}

} // namespace

Json spawn_process(const Json& id, const SpawnRequest& request, ProcessTable& processes)
{
    ExecRequest command = request.command;
    const SpawnSettings& settings = request.settings;
    if (settings.pty && !command.env.contains("TERM"))
        command.env["TERM"] = "xterm-256color";  // what terminal programs expect to draw on
    ChildPlan plan = plan_child(command);
    auto cgroup = std::make_unique<CallCgroup>("spawn");
    plan.cgroup_procs = cgroup->procs_fd();

    Fd child_in, child_out, child_err;   // the child's ends
    Fd output, errors, stdin_writer, pty_master;
    if (settings.pty) {
        Pty pty = open_pty(*settings.pty, plan.user ? plan.user : run_as());
        plan.controlling_tty = true;
        child_in = duplicate(pty.slave);
        child_out = duplicate(pty.slave);
        child_err = std::move(pty.slave);
        stdin_writer = duplicate(pty.master);
        pty_master = duplicate(pty.master);
        output = std::move(pty.master);
    } else {
        Pipe out = make_call_pipe();
        Pipe err = make_call_pipe();
        child_out = std::move(out.write);
        child_err = std::move(err.write);
        output = std::move(out.read);
        errors = std::move(err.read);
        if (settings.keep_stdin) {
            Pipe in = make_call_pipe();
            child_in = std::move(in.read);
            stdin_writer = std::move(in.write);
        } else {
            child_in = open_or_fail("/dev/null", O_RDONLY);
        }
    }
    auto stdin_feed = stdin_writer ? std::make_shared<ProcessStdin>(std::move(stdin_writer), settings.pty.has_value())
                                   : nullptr;

    AdmittedProcess process(processes, processes.admit(ProcessKind::spawn, command, settings.replay_bytes));
    const uint64_t oom_before = oom_kill_count();
    const Clock::time_point start = Clock::now();
    Launched launched = launch(plan, child_in.get(), child_out.get(), child_err.get());
    child_in.reset();
    child_out.reset();
    child_err.reset();
    process->started(launched.pid, duplicate(launched.pidfd), stdin_feed, std::move(pty_master));

    const uint64_t unlimited = UINT64_MAX;  // a spawned process's output is only counted, never held
    Background running{process.keep(),
                    std::move(cgroup),
                    launched.pid,
                    std::move(launched.pidfd),
                    {Capture(settings.pty ? "pty" : "stdout", std::move(output), unlimited, false),
                     Capture("stderr", std::move(errors), unlimited, false)},
                    std::move(stdin_feed),
                    command.timeout_s,
                    oom_before,
                    start};
    for (Capture& capture : running.captures)
        capture.tee_to(running.process.get());
    const std::shared_ptr<Process> kept = running.process;
    try {
        std::thread(drain_until_end, std::move(running)).detach();
    } catch (const std::system_error& e) {
        kept->kill_group();
        int status = 0;
        while (::waitpid(launched.pid, &status, 0) < 0 && errno == EINTR) {
        }
        processes.forget(kept);
        throw CallError("spawn_failed", std::string("thread: ") + e.what());
    }
    return Json{{"id", id}, {"ok", true}, {"pid", launched.pid}};
}

} // namespace agentvm
