#include "tests/support/process.hpp"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace agentvm::test {
namespace {

std::string slurp(int fd)
{
    std::string out;
    char buf[65536];
    off_t off = 0;
    ssize_t n;
    while ((n = ::pread(fd, buf, sizeof(buf), off)) > 0) {
        out.append(buf, static_cast<size_t>(n));
        off += n;
    }
    return out;
}

} // namespace

ProcessResult run_process(const std::vector<std::string>& argv, std::chrono::seconds timeout)
{
    // Output goes to memfds, not pipes: no reader thread, and no deadlock on large output.
    const int out_fd = ::memfd_create("stdout", MFD_CLOEXEC);
    const int err_fd = ::memfd_create("stderr", MFD_CLOEXEC);
    if (out_fd < 0 || err_fd < 0)
        throw std::runtime_error("memfd_create failed");
    std::vector<char*> args;
    for (const auto& a : argv)
        args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);

    const pid_t pid = ::fork();
    if (pid < 0)
        throw std::runtime_error("fork failed");
    if (pid == 0) {
        ::setpgid(0, 0);
        ::dup2(out_fd, STDOUT_FILENO);
        ::dup2(err_fd, STDERR_FILENO);
        ::execvp(args[0], args.data());
        ::_exit(127);
    }
    ::setpgid(pid, pid);

    ProcessResult result;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    for (;;) {
        const pid_t done = ::waitpid(pid, &status, WNOHANG);
        if (done == pid)
            break;
        if (std::chrono::steady_clock::now() > deadline) {
            result.timed_out = true;
            ::kill(-pid, SIGTERM);
            std::this_thread::sleep_for(std::chrono::seconds(2));
            ::kill(-pid, SIGKILL);
            ::waitpid(pid, &status, 0);
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    result.out = slurp(out_fd);
    result.err = slurp(err_fd);
    ::close(out_fd);
    ::close(err_fd);
    return result;
}

std::string read_file(const std::string& path)
{
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::string sha256_of(const std::string& path)
{
    const auto r = run_process({"sha256sum", path}, std::chrono::seconds(300));
    if (r.exit_code != 0)
        throw std::runtime_error("sha256sum failed on " + path + ": " + r.err);
    return r.out.substr(0, 64);
}

} // namespace agentvm::test
