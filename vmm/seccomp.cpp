#include "vmm/seccomp.hpp"

#include <linux/kvm.h>
#include <seccomp.h>
#include <sys/socket.h>
#include <termios.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>

#include <fmt/format.h>

#include "common/error.hpp"
#include "vmm/kvm_abi.hpp"

namespace agentvm {
namespace {

// Found by tracing every vCPU thread through cold boots, restores, bakes, episodes, guest
// reboots and SIGTERM teardowns (strace -f), then reasoned through for paths no run took.
// A vCPU thread neither shuts down nor closes a descriptor: a driver reset of the vsock
// device leaves closing the host streams to the I/O loop (VsockHost::on_reset).
constexpr std::array vcpu_syscalls = {
    SCMP_SYS(futex),           // mutexes, condition variables
    SCMP_SYS(write),           // eventfds (irqfd, loop, console and vsock-reset wake-ups), log lines
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

// The I/O loop thread from the vCPU threads' start to the process's exit, found the same way
// (strace of the jailed VMM through restores, cold boots, episodes with file transfers and a
// guest connecting out through --vsock-uds, the episode time limit, SIGTERM) and reasoned
// through for host connections to --vsock-uds and stdout back-pressure.
constexpr std::array io_loop_syscalls = {
    SCMP_SYS(io_uring_enter),  // all device and stream I/O
    SCMP_SYS(read),            // eventfds, timerfds, the agent's socket
    SCMP_SYS(write),           // eventfds (irqfd, wake-ups), stdout, console output, log lines
    SCMP_SYS(readv),
    SCMP_SYS(writev),
    SCMP_SYS(poll),            // waiting out a full stdout pipe; the console's last bytes
    SCMP_SYS(fstat),           // stdio sizes a stream's buffer on its first use
    SCMP_SYS(newfstatat),
    SCMP_SYS(close),
    SCMP_SYS(shutdown),
    SCMP_SYS(connect),         // to a host listener, for a guest connecting out (AF_UNIX only)
    SCMP_SYS(accept4),         // host clients of --vsock-uds
    SCMP_SYS(unlink),          // the --vsock-uds socket, at exit
    SCMP_SYS(timerfd_create),  // deadlines: boot, calls, the episode
    SCMP_SYS(timerfd_settime),
    SCMP_SYS(futex),
    SCMP_SYS(rt_sigprocmask),
    SCMP_SYS(rt_sigaction),
    SCMP_SYS(rt_sigreturn),
    SCMP_SYS(sigaltstack),
    SCMP_SYS(restart_syscall),
    SCMP_SYS(mmap),
    SCMP_SYS(munmap),
    SCMP_SYS(mprotect),
    SCMP_SYS(mremap),
    SCMP_SYS(brk),
    SCMP_SYS(madvise),
    SCMP_SYS(clock_gettime),
    SCMP_SYS(getrandom),       // std::random_device
    SCMP_SYS(getpid),
    SCMP_SYS(gettid),
    SCMP_SYS(exit),
    SCMP_SYS(exit_group),
};

// Writing a snapshot after the run: its directory and files, and reading the VM's state.
constexpr std::array snapshot_syscalls = {
    SCMP_SYS(openat),
    SCMP_SYS(mkdir),
    SCMP_SYS(rename),
    SCMP_SYS(unlinkat),        // removing a snapshot left half-written
    SCMP_SYS(rmdir),
    SCMP_SYS(getdents64),
    SCMP_SYS(fcntl),           // fdopendir, as removing a half-written snapshot walks it
    SCMP_SYS(statx),
    SCMP_SYS(lseek),
    SCMP_SYS(pread64),
    SCMP_SYS(pwrite64),
    SCMP_SYS(ftruncate),
    SCMP_SYS(copy_file_range), // the disk overlay's written ranges
    SCMP_SYS(fsync),
    SCMP_SYS(fallocate),       // punching pages that became zeros out of a live snapshot's memory
};

// A live snapshot's worker thread (core/loop_worker.hpp): clearing the soft-dirty bits and
// reading pagemap, copying guest RAM and the disk overlay into the snapshot's files while the
// VM runs, then syncing and hashing them and writing the manifest; its own memory and the
// eventfd that reports a job done. Plus snapshot_syscalls.
constexpr std::array snapshot_worker_syscalls = {
    SCMP_SYS(futex),
    SCMP_SYS(read),
    SCMP_SYS(write),           // clear_refs, the eventfd, log lines
    SCMP_SYS(fstat),
    SCMP_SYS(newfstatat),
    SCMP_SYS(close),
    SCMP_SYS(mmap),
    SCMP_SYS(munmap),
    SCMP_SYS(mprotect),
    SCMP_SYS(mremap),
    SCMP_SYS(brk),
    SCMP_SYS(madvise),
    SCMP_SYS(clock_gettime),
    SCMP_SYS(getpid),
    SCMP_SYS(gettid),
    SCMP_SYS(rt_sigprocmask),
    SCMP_SYS(rt_sigreturn),
    SCMP_SYS(sigaltstack),
    SCMP_SYS(restart_syscall),
    SCMP_SYS(exit),
    SCMP_SYS(exit_group),
};

// The ioctls a vCPU thread makes: entering the guest, and the serial port's interrupt line.
constexpr std::array vcpu_ioctls = {
    static_cast<unsigned long>(KVM_RUN),
    static_cast<unsigned long>(KVM_IRQ_LINE),
};
// The I/O loop raises the serial port's interrupt for console input; stdio asks whether a
// character device it first writes to is a terminal.
constexpr std::array io_loop_ioctls = {
    static_cast<unsigned long>(KVM_IRQ_LINE),
    static_cast<unsigned long>(TCGETS),
};
// Baking: every state ioctl vmm/vcpu_state.cpp and vmm/vm_kvm_state.cpp make.
constexpr std::array snapshot_ioctls = {
    static_cast<unsigned long>(KVM_CHECK_EXTENSION),
    kvm_abi::get_msr_index_list,
    kvm_abi::get_cpuid2,
    kvm_abi::get_msrs,
    kvm_abi::get_xsave,
    kvm_abi::get_xsave2,
    static_cast<unsigned long>(KVM_GET_REGS),
    static_cast<unsigned long>(KVM_GET_SREGS),
    static_cast<unsigned long>(KVM_GET_XCRS),
    static_cast<unsigned long>(KVM_GET_DEBUGREGS),
    static_cast<unsigned long>(KVM_GET_LAPIC),
    static_cast<unsigned long>(KVM_GET_MP_STATE),
    static_cast<unsigned long>(KVM_GET_VCPU_EVENTS),
    static_cast<unsigned long>(KVM_GET_IRQCHIP),
    static_cast<unsigned long>(KVM_GET_PIT2),
    static_cast<unsigned long>(KVM_GET_CLOCK),
    // The warm-up calls' dirty log (vmm/warm_pages.hpp).
    static_cast<unsigned long>(KVM_SET_USER_MEMORY_REGION),
    static_cast<unsigned long>(KVM_GET_DIRTY_LOG),
};

const char* role_name(SeccompRole role)
{
    switch (role) {
    case SeccompRole::vcpu:
        return "a vCPU thread";
    case SeccompRole::io_loop:
    case SeccompRole::io_loop_snapshot:
        return "the I/O loop thread";
    case SeccompRole::snapshot_worker:
        return "the snapshot worker thread";
    }
    return "?";
}

// Written by the handler, so plain data set before any filter is loaded.
thread_local const char* thread_role = "an unfiltered thread";

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
    put("agentvm: critical: seccomp: ");
    put(thread_role);
    put(" made system call ");
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
    const auto allow = [&](std::span<const int> syscalls) {
        for (const int syscall : syscalls)
            check(seccomp_rule_add(filter.get(), SCMP_ACT_ALLOW, syscall, 0), "adding a system call");
    };
    const auto allow_ioctls = [&](std::span<const unsigned long> requests) {
        for (const unsigned long request : requests)
            check(seccomp_rule_add(filter.get(), SCMP_ACT_ALLOW, SCMP_SYS(ioctl), 1, SCMP_A1(SCMP_CMP_EQ, request)),
                  "adding an ioctl");
    };
    if (role == SeccompRole::vcpu) {
        allow(vcpu_syscalls);
        allow_ioctls(vcpu_ioctls);
    } else if (role == SeccompRole::snapshot_worker) {
        allow(snapshot_worker_syscalls);
        allow(snapshot_syscalls);
    } else {
        allow(io_loop_syscalls);
        allow_ioctls(io_loop_ioctls);
        // Unix sockets only (the host side of vsock); the VMM has no network to reach anyway.
        for (const int call : {SCMP_SYS(socket), SCMP_SYS(socketpair)})
            check(seccomp_rule_add(filter.get(), SCMP_ACT_ALLOW, call, 1, SCMP_A0(SCMP_CMP_EQ, AF_UNIX)),
                  "adding a socket call");
        // Signals go to this process's own threads only (the vCPU kick).
        check(seccomp_rule_add(filter.get(), SCMP_ACT_ALLOW, SCMP_SYS(tgkill), 1,
                               SCMP_A0(SCMP_CMP_EQ, static_cast<scmp_datum_t>(::getpid()))),
              "adding tgkill");
        if (role == SeccompRole::io_loop_snapshot) {
            allow(snapshot_syscalls);
            allow_ioctls(snapshot_ioctls);
        }
    }
    thread_role = role_name(role);
    check(seccomp_load(filter.get()), "loading the filter");
}

} // namespace agentvm
