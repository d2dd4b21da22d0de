#include "guest/spawn.hpp"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>

#include "guest/console.hpp"

namespace agentvm {

namespace {

std::vector<char*> c_argv_of(const std::vector<std::string>& argv)
{
    std::vector<char*> c_argv;
    for (const std::string& arg : argv)
        c_argv.push_back(const_cast<char*>(arg.c_str()));
    c_argv.push_back(nullptr);
    return c_argv;
}

[[noreturn]] void exec_child(char* const* argv, const char* cwd, bool controlling_terminal)
{
    ::setsid();
    // Failure only costs the child job control; it still runs.
    if (controlling_terminal)
        ::ioctl(STDIN_FILENO, TIOCSCTTY, 1);
    if (::chdir(cwd) != 0 && ::chdir("/") != 0)
        say_errno("chdir");
    ::execve(argv[0], argv, environ);
    char what[256];
    std::snprintf(what, sizeof(what), "exec %s", argv[0]);
    say_errno(what);
    ::_exit(127);
}

} // namespace

std::optional<int> run_on_console(const std::vector<std::string>& argv, const char* cwd,
                                  const ReapedChild& on_reaped)
{
    // Built before fork: the child only execs.
    std::vector<char*> c_argv = c_argv_of(argv);
    pid_t child = ::fork();
    if (child < 0) {
        say_errno("fork");
        return std::nullopt;
    }
    if (child == 0)
        exec_child(c_argv.data(), cwd, true);

    for (;;) {
        int status = 0;
        pid_t pid = ::waitpid(-1, &status, 0);
        if (pid == child)
            return status;
        if (pid > 0) {
            on_reaped(pid, status);
        } else if (errno != EINTR) {
            say_errno("waitpid");
            return std::nullopt;
        }
    }
}

void reap_while(const std::function<bool()>& keep_going, const ReapedChild& on_reaped)
{
    while (keep_going()) {
        int status = 0;
        const pid_t pid = ::waitpid(-1, &status, 0);
        if (pid > 0) {
            on_reaped(pid, status);
        } else if (errno != EINTR) {
            say_errno("waitpid");
            return;
        }
    }
}

pid_t start_daemon(const std::vector<std::string>& argv, const char* cwd, int oom_score_adj)
{
    std::vector<char*> c_argv = c_argv_of(argv);
    const std::string adj = std::to_string(oom_score_adj);
    pid_t child = ::fork();
    if (child < 0) {
        say_errno("fork");
        return -1;
    }
    if (child == 0) {
        const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (null_fd >= 0)
            ::dup2(null_fd, STDIN_FILENO);
        // Set here, before it runs, so the daemon is never without it.
        const int adj_fd = ::open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
        if (adj_fd < 0 || ::write(adj_fd, adj.data(), adj.size()) != static_cast<ssize_t>(adj.size()))
            say_errno("oom_score_adj");
        exec_child(c_argv.data(), cwd, false);
    }
    return child;
}

void report_exit(const char* what, int wait_status)
{
    if (WIFSIGNALED(wait_status))
        say("%s killed by signal %d", what, WTERMSIG(wait_status));
    else
        say("%s exited %d", what, WEXITSTATUS(wait_status));
}

} // namespace agentvm
