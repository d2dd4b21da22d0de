#include "service/episode_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/pipe.hpp"

namespace agentvm {
namespace {

constexpr size_t stderr_keep = 16 * 1024;

void set_nonblocking(int fd)
{
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

// Hands on what a non-blocking fd holds now, until it is empty or at its end.
template <typename Take>
void read_available(int fd, Take take)
{
    char buffer[65536];
    for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;)
        take(std::string_view(buffer, static_cast<size_t>(n)));
}

} // namespace

EpisodeProcess::EpisodeProcess(EventLoop& loop, const std::string& program, const std::vector<std::string>& args,
                               Handlers handlers)
    : loop_(loop), handlers_(std::move(handlers)),
      stdout_lines_(max_line, [this](std::string&& line) { on_stdout_line(std::move(line)); },
                    [this] { broken(fmt::format("the episode sent a line over {} bytes", max_line)); })
{
    Pipe in = make_pipe();
    Pipe out = make_pipe();
    Pipe err = make_pipe();
    std::vector<std::string> argv_text{program, "episode", "--announce-ready"};
    argv_text.insert(argv_text.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& arg : argv_text)
        argv.push_back(arg.data());
    argv.push_back(nullptr);

    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0)
        throw_errno("fork (starting an episode)");
    if (pid_ == 0) {
        // The child: only async-signal-safe calls until exec.
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent)
            ::_exit(127);  // serve died before the line above took effect
        sigset_t none;
        sigemptyset(&none);
        ::sigprocmask(SIG_SETMASK, &none, nullptr);
        if (::dup2(in.read.get(), 0) < 0 || ::dup2(out.write.get(), 1) < 0 || ::dup2(err.write.get(), 2) < 0)
            ::_exit(127);
        ::execv(program.c_str(), argv.data());
        const char message[] = "agentvm serve: cannot execute the episode program\n";
        [[maybe_unused]] const ssize_t ignored = ::write(2, message, sizeof message - 1);
        ::_exit(127);
    }
    pidfd_ = Fd(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
    if (!pidfd_) {
        const int saved = errno;
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        exited_ = true;
        throw_errno("pidfd_open", saved);
    }
    stdin_fd_ = std::move(in.write);
    stdout_fd_ = std::move(out.read);
    stderr_fd_ = std::move(err.read);
    for (int fd : {stdin_fd_.get(), stdout_fd_.get(), stderr_fd_.get()})
        set_nonblocking(fd);
    stdin_.emplace(loop_, stdin_fd_.get(), [](int) {
        // The episode stopped reading (it ended): its exit says why, through on_exit.
    });
    stdout_reader_.emplace(loop_, stdout_fd_.get(),
                           FdReader::Handlers{[this](std::string_view bytes) { stdout_lines_.feed(bytes); },
                                              [this](int) { stdout_lines_.finish(); }});
    stderr_reader_.emplace(loop_, stderr_fd_.get(),
                           FdReader::Handlers{[this](std::string_view bytes) { keep_stderr(bytes); }, [](int) {}});
    stdout_reader_->start();
    stderr_reader_->start();
    loop_.watch_readable(pidfd_.get(), [this] { on_pidfd(); });
}

EpisodeProcess::~EpisodeProcess()
{
    if (!exited_) {
        loop_.unwatch(pidfd_.get());
        ::kill(pid_, SIGKILL);
        while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
        }
    }
    if (stdin_) {
        stdin_->stop();
        loop_.cancel_io(stdin_fd_.get());
    }
}

void EpisodeProcess::send(std::string line)
{
    if (stdin_ && !exited_)
        stdin_->write(std::move(line));
}

void EpisodeProcess::close_input()
{
    if (!stdin_)
        return;
    stdin_->when_flushed([this] {
        stdin_.reset();
        stdin_fd_.reset();
    });
}

void EpisodeProcess::terminate()
{
    if (!exited_)
        ::kill(pid_, SIGTERM);
}

void EpisodeProcess::kill()
{
    if (!exited_)
        ::kill(pid_, SIGKILL);
}

void EpisodeProcess::broken(const std::string& why)
{
    if (broken_)
        return;
    broken_ = true;
    handlers_.on_broken(why);
    kill();
}

void EpisodeProcess::on_stdout_line(std::string&& line)
{
    if (broken_)
        return;
    if (ready_) {
        handlers_.on_line(std::move(line));
        return;
    }
    // The first line is the announcement; anything else there is not an episode's.
    const auto doc = nlohmann::json::parse(line, nullptr, false);
    if (doc.is_object() && doc.value("event", "") == "ready" && doc.contains("restored")
        && doc["restored"].is_boolean()) {
        ready_ = true;
        handlers_.on_ready(doc["restored"].get<bool>());
        return;
    }
    broken("the episode's first line is not its ready announcement");
}

void EpisodeProcess::keep_stderr(std::string_view bytes)
{
    stderr_tail_.append(bytes);
    if (stderr_tail_.size() > stderr_keep)
        stderr_tail_.erase(0, stderr_tail_.size() - stderr_keep);
}

void EpisodeProcess::on_pidfd()
{
    int status = 0;
    const pid_t reaped = ::waitpid(pid_, &status, WNOHANG);
    if (reaped != pid_)
        return;
    exited_ = true;
    loop_.unwatch(pidfd_.get());
    // What the episode wrote before it ended is still in the pipes: read it first.
    stdout_reader_->stop();
    read_available(stdout_fd_.get(), [this](std::string_view bytes) { stdout_lines_.feed(bytes); });
    stdout_lines_.finish();
    stderr_reader_->stop();
    read_available(stderr_fd_.get(), [this](std::string_view bytes) { keep_stderr(bytes); });
    handlers_.on_exit(status);
}

} // namespace agentvm
