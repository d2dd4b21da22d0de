#include "guest/agent/process.hpp"

#include <signal.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "protocol/process_requests.hpp"

namespace agentvm {
namespace {

double seconds_since_epoch()
{
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Json end_json(const ProcessEnd& end)
{
    return Json{{"exit_code", end.exit_code ? Json(*end.exit_code) : Json(nullptr)},
                {"signal", end.signal ? Json(*end.signal) : Json(nullptr)},
                {"timed_out", end.timed_out},
                {"oom_killed", end.oom_killed},
                {"duration_ms", end.duration_ms}};
}

} // namespace

Process::Process(ProcessKind kind, const ExecRequest& command, uint64_t replay_bytes)
    : kind_(kind), tag_(command.tag), argv_(command.argv), env_(command.env), cwd_(command.cwd),
      started_at_(seconds_since_epoch()), start_(std::chrono::steady_clock::now()), output_(replay_bytes)
{
}

void Process::started(pid_t pid, Fd pidfd, std::shared_ptr<ProcessStdin> stdin_feed, Fd pty_master)
{
    std::lock_guard lock(mutex_);
    pid_ = pid;
    pidfd_ = std::move(pidfd);
    stdin_ = std::move(stdin_feed);
    pty_master_ = std::move(pty_master);
}

void Process::finish(const ProcessEnd& end)
{
    {
        std::lock_guard lock(mutex_);
        end_ = end;
        ended_at_ = std::chrono::steady_clock::now();
        stdin_.reset();
        pty_master_.reset();
    }
    changed_.notify_all();
}

pid_t Process::pid() const
{
    std::lock_guard lock(mutex_);
    return pid_;
}

bool Process::running() const
{
    std::lock_guard lock(mutex_);
    return !end_;
}

std::chrono::steady_clock::time_point Process::ended_at() const
{
    std::lock_guard lock(mutex_);
    return ended_at_;
}

Json Process::describe() const
{
    std::lock_guard lock(mutex_);
    Json entry{{"pid", pid_},
               {"tag", tag_ ? Json(*tag_) : Json(nullptr)},
               {"kind", kind_ == ProcessKind::exec ? "exec" : "spawn"},
               {"argv", argv_},
               {"env", env_},
               {"cwd", cwd_ ? Json(*cwd_) : Json(nullptr)},
               {"started_at", started_at_},
               {"running", !end_},
               {"stdin", static_cast<bool>(stdin_)},
               {"pty", static_cast<bool>(pty_master_)}};
    if (end_)
        entry["end"] = end_json(*end_);
    return entry;
}

void Process::append_output(const char* stream, std::string_view data)
{
    {
        std::lock_guard lock(mutex_);
        output_.append(stream, data);
    }
    changed_.notify_all();
}

void Process::attach()
{
    std::lock_guard lock(mutex_);
    if (attachments_ >= max_attachments)
        throw CallError("limit", "process " + std::to_string(pid_) + " has " + std::to_string(max_attachments)
                                     + " attachments already, the most it may have");
    ++attachments_;
}

void Process::detach()
{
    std::lock_guard lock(mutex_);
    --attachments_;
}

uint64_t Process::output_start() const
{
    std::lock_guard lock(mutex_);
    return output_.start();
}

uint64_t Process::output_end() const
{
    std::lock_guard lock(mutex_);
    return output_.end();
}

Process::Update Process::next(uint64_t& cursor, size_t max_bytes, std::chrono::milliseconds wait)
{
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, wait, [&] { return end_ || output_.end() > cursor; });
    Update update;
    if (cursor < output_.start()) {
        update.lost = output_.start() - cursor;
        cursor = output_.start();
    }
    update.chunks = output_.read(cursor, max_bytes);
    // The end only once the output is all read: it comes last.
    if (end_ && cursor >= output_.end())
        update.end = end_;
    return update;
}

void Process::require_running() const
{
    if (end_ || pid_ == 0)
        throw CallError("not_found", "process " + std::to_string(pid_) + " has ended");
}

void Process::send_stdin(std::string_view data)
{
    std::shared_ptr<ProcessStdin> feed;
    {
        std::lock_guard lock(mutex_);
        require_running();
        if (!stdin_)
            throw CallError("stdin_closed", kind_ == ProcessKind::exec
                                                ? "an exec call's stdin is given whole with the call"
                                                : "the process was spawned without \"stdin\":true");
        feed = stdin_;
    }
    feed->feed(data);
}

void Process::close_stdin()
{
    std::shared_ptr<ProcessStdin> feed;
    {
        std::lock_guard lock(mutex_);
        require_running();
        if (!stdin_)
            return;  // closed already, or never open
        feed = stdin_;
    }
    feed->close();
}

void Process::signal(int signal, bool group)
{
    std::lock_guard lock(mutex_);
    require_running();
    // Under the lock, before finish(): the drain reaps the process only after its pidfd
    // reported the exit, and a pidfd never names another process.
    const int result = group ? ::kill(-pid_, signal)
                             : static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd_.get(), signal, nullptr, 0));
    if (result != 0 && errno != ESRCH)
        throw CallError("io", std::string("signal: ") + std::strerror(errno));
}

void Process::resize(const PtySize& size)
{
    std::lock_guard lock(mutex_);
    require_running();
    if (!pty_master_)
        throw CallError("bad_field", "process " + std::to_string(pid_) + " has no pty");
    const winsize window{size.rows, size.cols, 0, 0};
    if (::ioctl(pty_master_.get(), TIOCSWINSZ, &window) != 0)
        throw CallError("io", std::string("resize: ") + std::strerror(errno));
}

void Process::kill_group() const
{
    std::lock_guard lock(mutex_);
    if (pid_ > 0 && !end_)
        ::kill(-pid_, SIGKILL);
}

} // namespace agentvm
