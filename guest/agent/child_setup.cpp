#include "guest/agent/child_setup.hpp"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string_view>

#include "guest/agent/accounts.hpp"
#include "guest/agent/call_cgroup.hpp"
#include "guest/agent/run_as.hpp"
#include "common/fd.hpp"

namespace agentvm {

namespace {

constexpr char default_path[] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

// Set by confine_calls() before any child exists; children only read it.
bool reset_oom_score = false;

int own_oom_score_adj()
{
    Fd fd(::open("/proc/self/oom_score_adj", O_RDONLY | O_CLOEXEC));
    char text[16] = {};
    if (!fd || ::read(fd.get(), text, sizeof(text) - 1) <= 0)
        return 0;
    return std::atoi(text);
}

// Async-signal-safe: runs between fork and execve.
bool write_text(int fd, std::string_view text)
{
    return ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
}

bool is_executable_file(const std::string& path)
{
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::string resolve(const std::string& name, const std::string& search_path)
{
    if (name.find('/') != std::string::npos)
        return name; // relative to the call's cwd, which only the child has
    size_t begin = 0;
    for (;;) {
        const size_t end = search_path.find(':', begin);
        std::string_view dir = std::string_view(search_path).substr(begin, end == std::string::npos ? end : end - begin);
        if (dir.empty())
            dir = "."; // an empty PATH entry means the current directory
        std::string candidate(dir);
        candidate += '/';
        candidate += name;
        if (is_executable_file(candidate))
            return candidate;
        if (end == std::string::npos)
            throw CallError("not_found", name + ": command not found in PATH");
        begin = end + 1;
    }
}

void write_failure(int fd, int stage)
{
    const ChildFailure failure{stage, errno};
    // Nothing to do if even this fails: the parent then sees exit status 127.
    [[maybe_unused]] ssize_t n = ::write(fd, &failure, sizeof(failure));
}

} // namespace

ChildPlan plan_child(const ExecRequest& request)
{
    std::map<std::string, std::string> env;
    for (char** entry = environ; *entry; ++entry) {
        const std::string_view text(*entry);
        const size_t eq = text.find('=');
        if (eq != std::string_view::npos)
            env.emplace(std::string(text.substr(0, eq)), std::string(text.substr(eq + 1)));
    }
    std::optional<UserAccount> account;
    if (request.user) {
        // As login and E2B's envd give them; the request's env may still say otherwise.
        account = find_user(*request.user);
        env["HOME"] = account->home;
        env["USER"] = account->name;
        env["LOGNAME"] = account->name;
    }
    for (const auto& [name, value] : request.env)
        env[name] = value;

    ChildPlan plan;
    auto path_var = env.find("PATH");
    plan.path = resolve(request.argv[0], path_var == env.end() ? default_path : path_var->second);
    plan.argv = request.argv;
    for (const auto& [name, value] : env)
        plan.env.push_back(name + "=" + value);
    plan.cwd = request.cwd.value_or(account ? account->home : "");
    if (account)
        plan.user = std::move(account->ids);
    for (std::string& arg : plan.argv)
        plan.c_argv.push_back(arg.data());
    plan.c_argv.push_back(nullptr);
    for (std::string& entry : plan.env)
        plan.c_env.push_back(entry.data());
    plan.c_env.push_back(nullptr);
    return plan;
}

void confine_calls(const std::optional<std::string>& cgroup_parent)
{
    CallCgroup::set_parent(cgroup_parent);
    reset_oom_score = own_oom_score_adj() != 0;
}

void exec_child(ChildPlan& plan, int stdin_fd, int stdout_fd, int stderr_fd, int status_fd)
{
    // First, before the command can start anything: "0" moves the writer itself, and every
    // process it starts from now on is born in the cgroup.
    if (plan.cgroup_procs >= 0 && !write_text(plan.cgroup_procs, "0")) {
        write_failure(status_fd, 2);
        ::_exit(127);
    }
    if (reset_oom_score) {
        const int fd = ::open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
        if (fd < 0 || !write_text(fd, "0")) {
            write_failure(status_fd, 3);
            ::_exit(127);
        }
    }
    ::setsid();
    ::signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    // dup2 clears O_CLOEXEC on the copies; the originals close at execve.
    ::dup2(stdin_fd, STDIN_FILENO);
    ::dup2(stdout_fd, STDOUT_FILENO);
    ::dup2(stderr_fd, STDERR_FILENO);
    // A new session has no controlling terminal; a pty's programs (shells, editors) want one.
    if (plan.controlling_tty)
        ::ioctl(STDIN_FILENO, TIOCSCTTY, 0);
    // Last of what needs root, and before the cwd, whose permissions are the user's to meet.
    if (const int error = plan.user ? drop_to(*plan.user) : drop_to_run_as(); error != 0) {
        errno = error;
        write_failure(status_fd, 4);
        ::_exit(127);
    }
    if (!plan.cwd.empty() && ::chdir(plan.cwd.c_str()) != 0) {
        write_failure(status_fd, 0);
        ::_exit(127);
    }
    ::execve(plan.path.c_str(), plan.c_argv.data(), plan.c_env.data());
    write_failure(status_fd, 1);
    ::_exit(127);
}

void throw_child_failure(const ChildPlan& plan, const ChildFailure& failure)
{
    if (failure.stage >= 2) {
        const char* what = failure.stage == 2   ? "joining the call's cgroup"
                           : failure.stage == 3 ? "setting oom_score_adj"
                                                : "taking the user's credentials";
        throw CallError("spawn_failed", std::string(what) + ": " + std::strerror(failure.error));
    }
    const bool missing = failure.error == ENOENT || failure.error == ENOTDIR;
    const std::string what = failure.stage == 0 ? "cwd " + plan.cwd : plan.path;
    throw CallError(missing ? "not_found" : "spawn_failed", what + ": " + std::strerror(failure.error));
}

} // namespace agentvm
