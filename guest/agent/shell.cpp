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
#include "protocol/shell_quote.hpp"

namespace agentvm {

namespace {

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

void Shell::start()
{
    try {
        bash_.start({"bash", "--noprofile", "--norc"}, cwd_);
        posix_sh_ = false;
    } catch (const CallError& e) {
        // An image without bash (busybox, distroless with a shell): the lines sent below are
        // POSIX, so sh serves them; every response says which shell ran.
        if (e.code() != "not_found")
            throw;
        bash_.start({"sh"}, cwd_);
        posix_sh_ = true;
    }
    bash_.send("exec 3>" + shell_quote(bash_.status_path()) + "\n");
}

Json Shell::not_run(const Json& id)
{
    return Json{{"id", id}, {"exit_code", nullptr}, {"signal", nullptr}, {"timed_out", false}, {"oom_killed", false},
                {"cancelled", true}, {"stdout", ""}, {"stdout_truncated", false}, {"stderr", ""},
                {"stderr_truncated", false}, {"duration_ms", 0}};
}

Json Shell::run(const Json& id, const ShellRequest& request, Outbox& outbox, int cancel_fd)
{
    if (!bash_.running())
        start();
    const std::string n = std::to_string(bash_.next_command());
    SessionProcess::Fifo out(bash_, "out." + n);
    SessionProcess::Fifo err(bash_, "err." + n);
    Capture captures[2] = {
        {"stdout", std::move(out.fd), request.max_output, request.output_in_response},
        {"stderr", std::move(err.fd), request.max_output, request.output_in_response},
    };

    const Clock::time_point start_time = Clock::now();
    bash_.send("eval " + shell_quote(request.cmd) + " >" + shell_quote(out.path) + " 2>" + shell_quote(err.path)
               + " </dev/null 3>&-; printf '%d\\n' \"$?\" >&3\n");

    StatusLine status_line(bash_.status_fd(), bash_.status_pending());
    const Drained drained = drain({bash_.pid(), bash_.cgroup(), bash_.pidfd(), cancel_fd,
                                   deadline_after(start_time, request.timeout_s)},
                                  captures, status_line, id, request.stream, outbox);

    Json response{{"id", id}};
    if (drained.wait_status) {
        // bash is gone: `exit`, a timeout or a cancel. Its jobs go with it.
        const int wait_status = *drained.wait_status;
        bash_.reaped();
        const bool killed = WIFSIGNALED(wait_status);
        response["exit_code"] = killed ? Json(nullptr) : Json(WEXITSTATUS(wait_status));
        response["signal"] = killed ? Json(WTERMSIG(wait_status)) : Json(nullptr);
    } else {
        response["exit_code"] = *status_line.status;
        response["signal"] = nullptr;
    }
    response["timed_out"] = drained.timed_out;
    response["oom_killed"] = false;
    if (posix_sh_)
        response["shell"] = "sh";
    put_outcome(response, drained, captures, start_time);
    return response;
}

} // namespace agentvm
