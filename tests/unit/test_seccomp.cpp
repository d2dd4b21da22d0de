// The vCPU threads' seccomp filter: what a vCPU thread needs still works under it, and any
// other system call ends the process with one line naming the call (and status 159), never
// letting it through. Each case runs in a forked child, since a filter cannot be undone.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <functional>
#include <string>

#include "vmm/seccomp.hpp"

using namespace agentvm;

namespace {

struct ChildResult {
    int status = 0;
    std::string err;
};

// Runs body in a child whose stderr is captured; the child exits 0 if body returns.
ChildResult in_filtered_child(const std::function<void()>& body, SeccompRole role = SeccompRole::vcpu)
{
    int pipe_fds[2];
    REQUIRE(::pipe(pipe_fds) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::dup2(pipe_fds[1], STDERR_FILENO);
        ::close(pipe_fds[0]);
        install_seccomp(role);
        body();
        ::_exit(0);
    }
    ::close(pipe_fds[1]);
    ChildResult r;
    char buffer[512];
    ssize_t n;
    while ((n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0)
        r.err.append(buffer, static_cast<size_t>(n));
    ::close(pipe_fds[0]);
    REQUIRE(::waitpid(pid, &r.status, 0) == pid);
    return r;
}

} // namespace

TEST_CASE("a vCPU thread's own calls pass its filter")
{
    const auto r = in_filtered_child([] {
        const char text[] = "still here\n";
        if (::write(STDERR_FILENO, text, sizeof text - 1) != sizeof text - 1)
            ::_exit(1);
    });
    CHECK(WIFEXITED(r.status));
    CHECK(WEXITSTATUS(r.status) == 0);
    CHECK(r.err == "still here\n");
}

TEST_CASE("any other call stops the process and names the call")
{
    const auto r = in_filtered_child([] { ::syscall(SYS_getppid); });
    INFO("stderr: " << r.err);
    CHECK(WIFEXITED(r.status));
    CHECK(WEXITSTATUS(r.status) == 128 + SIGSYS);
    CHECK(r.err.find("seccomp: a vCPU thread made system call " + std::to_string(SYS_getppid) + ",") !=
          std::string::npos);
}

TEST_CASE("an ioctl other than a vCPU's is refused too")
{
    const auto r = in_filtered_child([] { ::ioctl(STDERR_FILENO, FIONREAD, nullptr); });
    CHECK(WEXITSTATUS(r.status) == 128 + SIGSYS);
    CHECK(r.err.find("system call " + std::to_string(SYS_ioctl) + ",") != std::string::npos);
}

TEST_CASE("the I/O loop may use Unix sockets and signal its own threads, and nothing else")
{
    const auto ok = in_filtered_child(
        [] {
            int pair[2];
            if (::socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0 || ::write(pair[0], "x", 1) != 1)
                ::_exit(1);
            if (::syscall(SYS_tgkill, ::getpid(), ::gettid(), 0) != 0)
                ::_exit(2);
        },
        SeccompRole::io_loop);
    INFO("stderr: " << ok.err);
    CHECK(WIFEXITED(ok.status));
    CHECK(WEXITSTATUS(ok.status) == 0);

    const auto inet = in_filtered_child([] { ::socket(AF_INET, SOCK_STREAM, 0); }, SeccompRole::io_loop);
    CHECK(WEXITSTATUS(inet.status) == 128 + SIGSYS);
    CHECK(inet.err.find("seccomp: the I/O loop thread made system call " + std::to_string(SYS_socket) + ",") !=
          std::string::npos);

    // This test process, looked up before the child's filter (which forbids getppid) is in
    // place; signal 0 would harm nothing if the call were let through.
    const pid_t other = ::getpid();
    const auto other_process =
        in_filtered_child([other] { ::syscall(SYS_tgkill, other, other, 0); }, SeccompRole::io_loop);
    INFO("stderr: " << other_process.err);
    CHECK(WEXITSTATUS(other_process.status) == 128 + SIGSYS);
    CHECK(other_process.err.find("seccomp: the I/O loop thread made system call " + std::to_string(SYS_tgkill) +
                                 ",") != std::string::npos);
}

TEST_CASE("only a VM saved to a snapshot may open files")
{
    const auto serving = in_filtered_child([] { ::open("/dev/null", O_RDONLY); }, SeccompRole::io_loop);
    CHECK(WEXITSTATUS(serving.status) == 128 + SIGSYS);
    CHECK(serving.err.find("system call " + std::to_string(SYS_openat) + ",") != std::string::npos);

    const auto saving = in_filtered_child(
        [] {
            if (::open("/dev/null", O_RDONLY) < 0)
                ::_exit(1);
        },
        SeccompRole::io_loop_snapshot);
    CHECK(WIFEXITED(saving.status));
    CHECK(WEXITSTATUS(saving.status) == 0);
}

TEST_CASE("the snapshot worker copies and writes files, and nothing of the loop's or a vCPU's")
{
    const auto copying = in_filtered_child(
        [] {
            const int fd = ::open("/dev/null", O_WRONLY);
            if (fd < 0 || ::pwrite(fd, "x", 1, 0) != 1 || (::fsync(fd) != 0 && errno != EINVAL))
                ::_exit(1);
        },
        SeccompRole::snapshot_worker);
    INFO("stderr: " << copying.err);
    CHECK(WIFEXITED(copying.status));
    CHECK(WEXITSTATUS(copying.status) == 0);

    const auto socket = in_filtered_child([] { ::socket(AF_UNIX, SOCK_STREAM, 0); }, SeccompRole::snapshot_worker);
    CHECK(WEXITSTATUS(socket.status) == 128 + SIGSYS);
    CHECK(socket.err.find("seccomp: the snapshot worker thread made system call " + std::to_string(SYS_socket) +
                          ",") != std::string::npos);
    const auto ioctl = in_filtered_child([] { ::ioctl(0, TCGETS, nullptr); }, SeccompRole::snapshot_worker);
    CHECK(WEXITSTATUS(ioctl.status) == 128 + SIGSYS);
}
