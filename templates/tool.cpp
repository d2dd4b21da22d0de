#include "templates/tool.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "common/pipe.hpp"
#include "common/fd.hpp"

extern char** environ;

namespace agentvm {
namespace {

// What a failure shows of the tool's stderr: its last lines are where tools say why.
constexpr size_t stderr_tail_bytes = 2 * 1024;
constexpr size_t stderr_tail_lines = 12;

std::string tail_of(std::string text)
{
    while (!text.empty() && text.back() == '\n')
        text.pop_back();
    size_t begin = text.size() > stderr_tail_bytes ? text.size() - stderr_tail_bytes : 0;
    size_t lines = 0;
    for (size_t at = text.size(); at > begin;) {
        const size_t newline = text.rfind('\n', at - 1);
        if (newline == std::string::npos || newline < begin)
            break;
        if (++lines == stderr_tail_lines) {
            begin = newline + 1;
            break;
        }
        at = newline;
    }
    return begin == 0 ? text : "[...]\n" + text.substr(begin);
}

bool in_path(const std::string& name)
{
    const char* path = std::getenv("PATH");
    std::string_view dirs = path ? path : "/usr/bin:/bin";
    while (!dirs.empty()) {
        const size_t colon = dirs.find(':');
        const std::string dir(dirs.substr(0, colon));
        if (!dir.empty() && ::access((dir + "/" + name).c_str(), X_OK) == 0)
            return true;
        dirs = colon == std::string_view::npos ? std::string_view{} : dirs.substr(colon + 1);
    }
    return false;
}

} // namespace

void require_tools(const std::vector<std::pair<std::string, std::string>>& tool_and_package)
{
    std::vector<std::string> missing;
    for (const auto& [tool, package] : tool_and_package)
        if (!in_path(tool))
            missing.push_back(fmt::format("{} (apt-get install {})", tool, package));
    if (!missing.empty())
        throw Error(fmt::format("not found in PATH: {}", fmt::join(missing, ", ")));
}

std::string run_tool(const std::vector<std::string>& argv, const ToolOptions& options)
{
    spdlog::debug("{}: {}", options.what, fmt::join(argv, " "));
    Pipe out = make_pipe();
    Pipe err = make_pipe();
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, out.write.get(), 1);
    posix_spawn_file_actions_adddup2(&actions, err.write.get(), 2);
    std::vector<char*> c_argv;
    for (const std::string& arg : argv)
        c_argv.push_back(const_cast<char*>(arg.c_str()));
    c_argv.push_back(nullptr);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attributes, 0);
    pid_t pid = -1;
    const int spawned = ::posix_spawnp(&pid, c_argv[0], &actions, &attributes, c_argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
    if (spawned != 0)
        throw_errno(fmt::format("{}: starting {}", options.what, argv[0]), spawned);
    out.write.reset();
    err.write.reset();

    std::string stdout_text;
    std::string stderr_text;
    bool too_much = false;
    pollfd fds[2] = {{out.read.get(), POLLIN, 0}, {err.read.get(), POLLIN, 0}};
    int open_streams = 2;
    const auto deadline = std::chrono::steady_clock::now() + options.timeout;
    bool timed_out = false;
    while (open_streams > 0) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
            // Its group: what the tool started goes too, and the pipes close.
            ::kill(-pid, SIGKILL);
            timed_out = true;
            break;
        }
        const int ready = ::poll(fds, 2, static_cast<int>(std::min<long long>(left.count(), 60'000)));
        if (ready < 0) {
            if (errno == EINTR)
                continue;
            ::kill(-pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
            throw_errno(options.what + ": poll");
        }
        for (pollfd& p : fds) {
            if (p.fd < 0 || !(p.revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            char buffer[65536];
            const ssize_t n = ::read(p.fd, buffer, sizeof buffer);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                p.fd = -1;
                --open_streams;
                continue;
            }
            const std::string_view chunk(buffer, static_cast<size_t>(n));
            if (p.fd == out.read.get()) {
                if (stdout_text.size() + chunk.size() > options.max_stdout)
                    too_much = true;
                else
                    stdout_text.append(chunk);
            } else {
                if (options.show_stderr)
                    (void)!::write(2, chunk.data(), chunk.size());
                stderr_text.append(chunk);
                if (stderr_text.size() > 4 * stderr_tail_bytes)
                    stderr_text.erase(0, stderr_text.size() - 2 * stderr_tail_bytes);
            }
        }
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            throw_errno(options.what + ": waitpid");
    const std::string said = stderr_text.empty() ? "" : ":\n" + tail_of(stderr_text);
    if (timed_out)
        throw Error(fmt::format("{} failed: {} did not finish within {} s and was killed{}", options.what, argv[0],
                                options.timeout.count(), said));
    if (WIFSIGNALED(status))
        throw Error(fmt::format("{} failed: {} was killed by signal {}{}", options.what, argv[0], WTERMSIG(status), said));
    if (WEXITSTATUS(status) != 0)
        throw Error(fmt::format("{} failed: {} exited with status {}{}", options.what, argv[0], WEXITSTATUS(status), said));
    if (too_much)
        throw Error(fmt::format("{}: {} wrote more than {} bytes to stdout", options.what, argv[0], options.max_stdout));
    return stdout_text;
}

} // namespace agentvm
