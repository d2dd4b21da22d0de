#include "episode/agent_vm.hpp"

#include <malloc.h>

#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "vmm/host_check.hpp"
#include "vmm/jail.hpp"
#include "vmm/snapshot.hpp"

namespace agentvm {
namespace {

// Long enough for a guest kernel's reboot or power-off path to finish, even emulated.
constexpr auto vm_end_grace = std::chrono::seconds(2);

// The user's own mistakes are named first, then the host's.
VmConfig checked_config(VmOptions& options)
{
    VmConfig config = options.resolve();
    const HostKvm host = detect_host_kvm();
    if (host != HostKvm::hardware)
        throw Error(host_kvm_problem(host));
    return config;
}

} // namespace

AgentVm::AgentVm(VmOptions& options, std::chrono::milliseconds boot_timeout)
    : options_(options), boot_timeout_(boot_timeout), started_(std::chrono::steady_clock::now())
{
    VmConfig config = checked_config(options);
    const std::optional<std::string> snapshot = options.snapshot_dir();
    kvm_.emplace();
    std::optional<LoadedSnapshot> loaded;
    if (snapshot) {
        // 0: whatever the snapshot recorded.
        VmConfig wanted = config;
        if (!options.given("--cpus"))
            wanted.vcpus = 0;
        if (!options.given("--mem"))
            wanted.mem_mib = 0;
        try {
            loaded.emplace(load_snapshot(*kvm_, *snapshot, std::move(wanted)));
            spdlog::debug("restoring from snapshot '{}'", *snapshot);
        } catch (const Error& e) {
            // A snapshot the user named must be usable; set-up's default one may be stale
            // (kernel or rootfs rebuilt since), and a cold boot is still correct, only slower.
            if (options.snapshot_given())
                throw;
            spdlog::warn("not using the default snapshot: {}; booting instead (`agentvm snapshot bake --default` bakes it again)",
                         e.what());
        }
    }
    // Before guest memory exists, so that all of it is counted against the VMM's limit.
    options.apply_limits(loaded ? loaded->config : config);
    // The console file is created only once nothing else can fail before the VM exists.
    const int console_fd = options.open_console();
    try {
        if (loaded) {
            loaded->config.console_fd = console_fd;
            vm_.emplace(*kvm_, loaded->config, std::move(loaded->data));
            restored_ = true;
            origin_ = std::move(loaded->origin);
        } else {
            config.console_fd = console_fd;
            options.wait_for_cgroup();  // booting writes the kernel into guest memory
            vm_.emplace(*kvm_, config);
        }
    } catch (...) {
        options.discard_console();
        throw;
    }
    spdlog::debug("kernel command line: {}", vm_->cmdline());
}

VmResult AgentVm::run(std::function<void(Fd agent)> on_connected, std::function<void()> on_stopping)
{
    // Everything the VM needs by name is open; the threads that run() starts inherit the jail.
    if (vm_->config().jail)
        lock_down(options_.jail_spec(vm_->config()));
    if (const auto limit = options_.episode_timeout()) {
        episode_deadline_.emplace(vm_->event_loop(), [this, limit] {
            time_ran_out_ = true;
            fail(fmt::format("the episode's time limit of {} s (--episode-timeout) ran out", limit->count() / 1000));
        });
        const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started_);
        episode_deadline_->arm(std::max(*limit - spent, std::chrono::milliseconds(1)));
    }
    // Setting up parsed and hashed megabytes (snapshot state, kernel image) that are free now
    // but still held by malloc; an idle VM should cost the host only what it uses.
    ::malloc_trim(0);
    signals_.watch(*vm_);
    link_.emplace(*vm_, boot_timeout_, restored_, std::move(on_connected), [this](const std::string& why) { fail(why); });
    vm_->on_stopping([this, on_stopping = std::move(on_stopping)] {
        link_->cancel();
        on_stopping();
    });
    link_->start();
    return vm_->run();
}

void AgentVm::fail_unless_vm_ends(const std::string& why)
{
    if (grace_)
        return;
    grace_.emplace(vm_->event_loop(), [this, why] { fail(why); });
    grace_->arm(vm_end_grace);
}

} // namespace agentvm
