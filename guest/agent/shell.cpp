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
#include "protocol/env_limits.hpp"
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

// The shell variables that keep, while a command runs with an env of its own, whether the
// N-th of its names was set and its value then; and the command's status until that is back.
std::string was_set(size_t n)
{
    return "__agentvm_set_" + std::to_string(n);
}

std::string old_value(size_t n)
{
    return "__agentvm_was_" + std::to_string(n);
}

constexpr char saved_status[] = "__agentvm_status";

// POSIX lines, for sh as for bash.
std::string export_env(const std::map<std::string, std::string>& env)
{
    std::string line;
    size_t n = 0;
    for (const auto& [name, value] : env) {
        line += was_set(n) + "=${" + name + "+x}; " + old_value(n) + "=${" + name + "-}; export " + name + "="
            + shell_quote(value) + "; ";
        ++n;
    }
    return line;
}

std::string restore_env(const std::map<std::string, std::string>& env)
{
    std::string line;
    size_t n = 0;
    for (const auto& [name, value] : env) {
        line += "if [ -n \"$" + was_set(n) + "\" ]; then " + name + "=$" + old_value(n) + "; else unset " + name
            + "; fi; unset " + was_set(n) + " " + old_value(n) + "; ";
        ++n;
    }
    return line;
}

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

void Shell::check_env(const std::map<std::string, std::string>& env)
{
    for (const auto& [name, value] : env)
        if (!is_env_name(name))
            throw CallError("bad_field", "\"env\": \"" + name.substr(0, 64)
                                             + "\" is not a name a shell can export (letters, digits and _, not a "
                                               "digit first, at most "
                                             + std::to_string(max_env_name_bytes) + " bytes)");
}

Json Shell::run(const Json& id, const ShellRequest& request, Outbox& outbox, int cancel_fd,
                const std::map<std::string, std::string>& env)
{
    check_env(env);
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
    const std::string command = "eval " + shell_quote(request.cmd) + " >" + shell_quote(out.path) + " 2>"
        + shell_quote(err.path) + " </dev/null 3>&-; ";
    if (env.empty())
        bash_.send(command + "printf '%d\\n' \"$?\" >&3\n");
    else
        bash_.send(export_env(env) + command + saved_status + "=$?; " + restore_env(env) + "printf '%d\\n' \"$"
                   + saved_status + "\" >&3; unset " + saved_status + "\n");

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
