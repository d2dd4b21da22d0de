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
#include "guest/agent/launch.hpp"
#include "common/error.hpp"
#include "common/fd.hpp"

namespace agentvm {

namespace {

// An exec call's output is in its response; what an attachment from elsewhere may replay of
// it is less than a spawned process keeps.
constexpr uint64_t exec_replay_bytes = min_replay_bytes;

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

Json run_exec(const Json& id, const ExecRequest& request, Outbox& outbox, int cancel_fd, ProcessTable& processes)
{
    ChildPlan plan = plan_child(request);
    // Outlives the child: removed once the call has reaped it (or later, see CallCgroup).
    const CallCgroup cgroup("exec");
    plan.cgroup_procs = cgroup.procs_fd();

    Pipe out = make_call_pipe();
    Pipe err = make_call_pipe();
    Pipe in;
    if (request.stdin_data) {
        in = make_call_pipe();
    } else {
        in.read = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
        if (!in.read)
            throw CallError("spawn_failed", std::string("/dev/null: ") + std::strerror(errno));
    }

    AdmittedProcess process(processes, processes.admit(ProcessKind::exec, request, exec_replay_bytes));
    const uint64_t oom_before = oom_kill_count();
    const Clock::time_point start = Clock::now();
    Launched launched = launch(plan, in.read.get(), out.write.get(), err.write.get());
    in.read.reset();
    out.write.reset();
    err.write.reset();
    Fd signal_pidfd(::fcntl(launched.pidfd.get(), F_DUPFD_CLOEXEC, 0));
    process->started(launched.pid, std::move(signal_pidfd), nullptr, Fd());
    const std::shared_ptr<Process> kept = process.keep();

    Capture captures[2] = {
        {"stdout", std::move(out.read), request.max_output, request.output_in_response},
        {"stderr", std::move(err.read), request.max_output, request.output_in_response},
    };
    for (Capture& capture : captures)
        capture.tee_to(kept.get());
    StdinFeed feed(std::move(in.write), request.stdin_data ? std::string_view(*request.stdin_data) : "");
    const Drained drained = drain({launched.pid, cgroup, launched.pidfd.get(), cancel_fd, deadline_after(start, request.timeout_s)},
                                  captures, feed, id, request.stream, outbox);
    const ProcessEnd end = end_of(drained, oom_before, start);
    kept->finish(end);

    Json response{{"id", id}};
    response["exit_code"] = end.exit_code ? Json(*end.exit_code) : Json(nullptr);
    response["signal"] = end.signal ? Json(*end.signal) : Json(nullptr);
    response["timed_out"] = end.timed_out;
    response["oom_killed"] = end.oom_killed;
    put_outcome(response, drained, captures, start);
    return response;
}

} // namespace agentvm
