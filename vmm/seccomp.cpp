#include "vmm/seccomp.hpp"

#include <linux/kvm.h>
#include <seccomp.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>

#include <fmt/format.h>

#include "vmm/error.hpp"

namespace agentvm {
namespace {

// Found by tracing every vCPU thread through cold boots, restores, bakes, episodes, guest
// reboots and SIGTERM teardowns (strace -f), then reasoned through for paths no run took:
// a driver reset of the vsock device closes host streams from the vCPU thread.
constexpr std::array vcpu_syscalls = {
    SCMP_SYS(futex),           // mutexes, condition variables
    SCMP_SYS(write),           // eventfds (irqfd, loop wake-up), console output, log lines
    SCMP_SYS(shutdown),        // vsock streams dropped by a device reset
    SCMP_SYS(close),           // ... and closed, when nothing else holds them
    SCMP_SYS(rt_sigprocmask),  // the kick signal around KVM_RUN
    SCMP_SYS(rt_sigreturn),    // returning from the kick signal's handler
    SCMP_SYS(sigaltstack),     // AddressSanitizer's runtime sets one up around handlers and exits
    SCMP_SYS(restart_syscall), // a futex wait the kick signal interrupted
    SCMP_SYS(mmap),            // malloc's arenas
    SCMP_SYS(munmap),
    SCMP_SYS(mprotect),
    SCMP_SYS(mremap),
    SCMP_SYS(brk),
    SCMP_SYS(madvise),         // thread exit frees its stack
    SCMP_SYS(clock_gettime),   // where the vDSO falls back to the system call
    SCMP_SYS(gettid),
    SCMP_SYS(exit),
    SCMP_SYS(exit_group),      // the SIGSYS reporter's own exit
};

// The ioctls a vCPU thread makes: entering the guest, and the serial port's interrupt line.
constexpr std::array vcpu_ioctls = {
    static_cast<unsigned long>(KVM_RUN),
    static_cast<unsigned long>(KVM_IRQ_LINE),
};

const char* role_name(SeccompRole role)
{
    switch (role) {
    case SeccompRole::vcpu:
        return "vCPU";
    }
    return "?";
}

// Written by the handler, so plain data set before any filter is loaded.
thread_local const char* thread_role = "unfiltered";

// Async-signal-safe: formats without allocating, writes, exits.
void report_bad_syscall(int, siginfo_t* info, void*)
{
    char line[200];
    size_t len = 0;
    auto put = [&](const char* text) {
        while (*text && len < sizeof line)
            line[len++] = *text++;
    };
    char number[12] = {};
    size_t at = sizeof number - 1;
    unsigned value = static_cast<unsigned>(info->si_syscall);
    do {
        number[--at] = static_cast<char>('0' + value % 10);
        value /= 10;
    } while (value != 0 && at > 0);
    put("agentvm: critical: seccomp: a ");
    put(thread_role);
    put(" thread made system call ");
    put(number + at);
    put(", which it never needs; stopping the VMM (--no-jail turns the filters off for debugging)\n");
    [[maybe_unused]] ssize_t written = ::write(STDERR_FILENO, line, len);
    ::_exit(128 + SIGSYS);
}

void install_reporter()
{
    struct sigaction action {};
    action.sa_sigaction = report_bad_syscall;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    if (::sigaction(SIGSYS, &action, nullptr) != 0)
        throw_errno("installing the SIGSYS handler for seccomp");
}

void check(int rc, const char* what)
{
    if (rc < 0)
        throw_errno(fmt::format("seccomp: {}", what), -rc);
}

} // namespace

void install_seccomp(SeccompRole role)
{
    static std::once_flag reporter;
    std::call_once(reporter, install_reporter);

    const std::unique_ptr<void, decltype(&seccomp_release)> filter(seccomp_init(SCMP_ACT_TRAP), seccomp_release);
    if (!filter)
        throw Error("seccomp: cannot create a filter");
    for (const int syscall : vcpu_syscalls)
        check(seccomp_rule_add(filter.get(), SCMP_ACT_ALLOW, syscall, 0), "adding a system call");
    for (const unsigned long request : vcpu_ioctls)
        check(seccomp_rule_add(filter.get(), SCMP_ACT_ALLOW, SCMP_SYS(ioctl), 1, SCMP_A1(SCMP_CMP_EQ, request)),
              "adding an ioctl");
    thread_role = role_name(role);
    check(seccomp_load(filter.get()), "loading the filter");
}

} // namespace agentvm
