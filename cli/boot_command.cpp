#include "cli/boot_command.hpp"

#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <array>
#include <memory>
#include <optional>

#include <spdlog/spdlog.h>

#include "cli/exit_codes.hpp"
#include "cli/vm_options.hpp"
#include "vmm/error.hpp"
#include "vmm/host_check.hpp"
#include "vmm/kvm.hpp"
#include "vmm/vm.hpp"

namespace agentvm {
namespace {

// ^D at the start of a line: the guest tty's end-of-file, so a shell reading the console sees
// host stdin end as its own stdin ending.
constexpr uint8_t console_eof = 0x04;

// SIGINT and SIGTERM are taken through a signalfd on the I/O loop, so they end the VM through
// the same orderly path as a guest power-off. They are blocked before any thread starts, so
// every vCPU thread inherits the mask and none is picked to run a default handler.
Fd block_stop_signals()
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    if (::pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0)
        throw Error("cannot block SIGINT/SIGTERM");
    Fd fd(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
    if (!fd)
        throw_errno("signalfd");
    return fd;
}

void forward_stdin(Vm& vm)
{
    auto& loop = vm.event_loop();
    loop.watch_readable(STDIN_FILENO, [&vm, &loop] {
        std::array<uint8_t, 4096> buf;
        const ssize_t n = ::read(STDIN_FILENO, buf.data(), buf.size());
        if (n > 0) {
            vm.console_input({buf.data(), static_cast<size_t>(n)});
            return;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        vm.console_input({&console_eof, 1});
        loop.unwatch(STDIN_FILENO);
    });
}

int run_boot(VmOptions& options)
{
    // The user's own mistakes are named first, then the host's, and the console file is
    // created only once nothing else can fail before the VM exists.
    VmConfig config = options.resolve();
    const HostKvm host = detect_host_kvm();
    if (host != HostKvm::hardware)
        throw Error(host_kvm_problem(host));
    Kvm kvm;
    Fd signals = block_stop_signals();
    config.console_fd = options.open_console();
    std::optional<Vm> built;
    try {
        built.emplace(kvm, config);
    } catch (...) {
        options.discard_console();
        throw;
    }
    Vm& vm = *built;
    int stop_signal = 0;
    vm.event_loop().watch_readable(signals.get(), [&] {
        signalfd_siginfo info{};
        if (::read(signals.get(), &info, sizeof(info)) == sizeof(info)) {
            stop_signal = static_cast<int>(info.ssi_signo);
            vm.stop(VmOutcome::stopped, strsignal(stop_signal));
        }
    });
    if (::fcntl(STDIN_FILENO, F_GETFD) != -1)
        forward_stdin(vm);

    spdlog::debug("kernel command line: {}", vm.cmdline());
    const VmResult result = vm.run();
    switch (result.outcome) {
    case VmOutcome::powered_off:
        spdlog::info("guest powered off");
        break;
    case VmOutcome::panicked:
        spdlog::error("guest kernel panic: {}", result.detail);
        break;
    case VmOutcome::failed:
        spdlog::error("VM failed: {}", result.detail);
        break;
    case VmOutcome::stopped:
        spdlog::warn("VM stopped: {}", result.detail);
        break;
    }
    return exit_code::from(result, stop_signal);
}

} // namespace

Subcommand add_boot_command(CLI::App& app)
{
    auto* boot = app.add_subcommand("boot", "Boot a guest and stay attached until it powers off");
    auto options = std::make_shared<VmOptions>();
    options->add_to(*boot);
    return {boot, [options] { return run_boot(*options); }};
}

} // namespace agentvm
