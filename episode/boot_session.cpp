#include "episode/boot_session.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <optional>

#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "episode/exit_codes.hpp"
#include "episode/stop_signals.hpp"
#include "vmm/host_check.hpp"
#include "vmm/jail.hpp"
#include "vmm/kvm.hpp"
#include "vmm/vm.hpp"

namespace agentvm {
namespace {

// ^D at the start of a line: the guest tty's end-of-file, so a shell reading the console sees
// host stdin end as its own stdin ending.
constexpr uint8_t console_eof = 0x04;

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

} // namespace

int run_boot(VmOptions& options)
{
    // The user's own mistakes are named first, then the host's, and the console file is
    // created only once nothing else can fail before the VM exists.
    VmConfig config = options.resolve();
    const HostKvm host = detect_host_kvm();
    if (host != HostKvm::hardware)
        throw Error(host_kvm_problem(host));
    Kvm kvm;
    StopSignals signals;
    options.apply_limits(config);
    options.wait_for_cgroup();
    config.console_fd = options.open_console();
    std::optional<Vm> built;
    try {
        built.emplace(kvm, config);
    } catch (...) {
        options.discard_console();
        throw;
    }
    Vm& vm = *built;
    signals.watch(vm);
    if (::fcntl(STDIN_FILENO, F_GETFD) != -1)
        forward_stdin(vm);

    spdlog::debug("kernel command line: {}", vm.cmdline());
    if (config.jail)
        lock_down(options.jail_spec(config));
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
    case VmOutcome::finished:
        spdlog::warn("VM stopped: {}", result.detail);
        break;
    }
    return exit_code::from(result, signals.received());
}

} // namespace agentvm
