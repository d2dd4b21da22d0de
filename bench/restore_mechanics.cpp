// restore-mechanics-probe: what bench/restore-mechanics times, the VMM's own cost to restore a
// snapshot on this machine's /dev/kvm, with a guest so small that the guest itself costs
// nothing. It goes through the product's own code (load_snapshot, Vm), not a copy of it.
//
//   bake DIR     runs the kvm tier's trace_counter guest until it has reported count
//                `baked_at` on its trace port and writes its snapshot to DIR (which must not
//                exist), as `agentvm snapshot bake` writes one;
//   restore DIR  restores it as `agentvm run --snapshot` does: checks the snapshot, creates the
//                VM, its irqchip and PIT, maps its memory MAP_PRIVATE from the memory file,
//                creates the vCPU and loads the saved state, vCPU then VM-wide; runs it up to
//                the guest's first port write, and prints on stdout the CLOCK_MONOTONIC time
//                in ns at which that write reached the VMM. Exits 0 only if the write is
//                count baked_at + 1: proof that the guest went on exactly where it stopped.
//   restore-jailed DIR
//                the same, jailed as agentvm's commands are (vmm/supervisor.hpp,
//                vmm/jail.hpp): a supervised child in its own cgroup and namespaces, locked
//                down once the VM is built, the I/O loop thread filtered too.
//
// /dev/kvm may be PVM: trace_counter takes no interrupt or exception. Where a machine has no
// /dev/kvm, bench/restore-mechanics runs this inside the test host, on its nested KVM.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "core/bus.hpp"
#include "vmm/cgroup.hpp"
#include "common/error.hpp"
#include "vmm/jail.hpp"
#include "vmm/kvm.hpp"
#include "vmm/snapshot.hpp"
#include "vmm/supervisor.hpp"
#include "vmm/vm.hpp"

using namespace agentvm;

namespace {

// Far enough into the count that the snapshot holds a guest in mid-loop, with a non-zero
// count in a register and a sum in memory.
constexpr uint32_t baked_at = 500;

// The tiny guests' ports (tests/kvm/guest/start.S): 0x500 the result, 0x504 the trace.
constexpr uint16_t guest_ports = 0x500;
constexpr uint64_t guest_port_count = 8;
constexpr uint64_t trace_offset = 4;

struct PortWrite {
    uint64_t offset;
    uint32_t value;
    std::chrono::steady_clock::time_point when;  // steady_clock is CLOCK_MONOTONIC
};

// Stops the VM at the first write to the guest's ports that `stop_here` accepts, and keeps it.
// Writes come on the vCPU thread; read seen() only after the VM's run(), which joins it.
class StopAtWrite : public BusDevice {
public:
    StopAtWrite(Vm& vm, std::function<bool(const PortWrite&)> stop_here)
        : vm_(vm), stop_here_(std::move(stop_here))
    {
        vm.pio_bus().insert(guest_ports, guest_port_count, *this);
    }

    void bus_read(uint64_t, std::span<uint8_t> data) override { std::fill(data.begin(), data.end(), 0); }
    void bus_write(uint64_t offset, std::span<const uint8_t> data) override
    {
        PortWrite write{offset, 0, std::chrono::steady_clock::now()};
        std::memcpy(&write.value, data.data(), std::min(data.size(), sizeof write.value));
        if (seen_ || !stop_here_(write))
            return;
        seen_ = write;
        // The vCPU loop sees the stop before it re-enters the guest, completes this OUT and
        // stops: the guest is saved (or ends) right after this write.
        vm_.stop(VmOutcome::finished, "the write it waited for");
    }

    const std::optional<PortWrite>& seen() const { return seen_; }

private:
    Vm& vm_;
    std::function<bool(const PortWrite&)> stop_here_;
    std::optional<PortWrite> seen_;
};

VmConfig guest_config()
{
    VmConfig config;
    config.kernel_path = TRACE_COUNTER_ELF;
    config.mem_mib = 64;  // what the kvm tier gives its tiny guests
    return config;
}

void check_finished(const VmResult& result, const std::optional<PortWrite>& seen, const char* phase)
{
    if (result.outcome != VmOutcome::finished || !seen)
        throw Error(fmt::format("{}: the guest ended before the port write it waited for: {}", phase,
                                result.detail));
}

void bake(const std::string& dir)
{
    const Kvm kvm;
    const VmConfig config = guest_config();
    Vm vm(kvm, config);
    const SnapshotWriter writer(kvm, config, dir);
    StopAtWrite stop(vm, [](const PortWrite& w) { return w.offset == trace_offset && w.value == baked_at; });
    check_finished(vm.run(), stop.seen(), "bake");
    writer.write(vm);
}

// cgroup: jailed, in this cgroup (as AgentVm and VmOptions do it); null: not jailed.
int restore(const std::string& dir, VmCgroup* cgroup)
{
    const Kvm kvm;
    // vcpus and mem_mib 0: what the snapshot recorded, as `agentvm run --snapshot` asks.
    VmConfig wanted = guest_config();
    wanted.vcpus = 0;
    wanted.mem_mib = 0;
    wanted.jail = cgroup != nullptr;
    wanted.run_thread_filter = SeccompRole::io_loop;
    LoadedSnapshot loaded = load_snapshot(kvm, dir, std::move(wanted));
    if (cgroup)
        cgroup->limit({static_cast<double>(loaded.config.vcpus), (loaded.config.mem_mib + 256) << 20, 512});
    Vm vm(kvm, loaded.config, std::move(loaded.data));
    StopAtWrite stop(vm, [](const PortWrite&) { return true; });
    if (cgroup)
        lock_down(JailSpec{});
    check_finished(vm.run(), stop.seen(), "restore");
    if (stop.seen()->offset != trace_offset || stop.seen()->value != baked_at + 1) {
        spdlog::error("the restored guest's first port write is {} to port {:#x}, expected count {} to port "
                      "{:#x}: it did not go on where it was baked",
                      stop.seen()->value, guest_ports + stop.seen()->offset, baked_at + 1, guest_ports + trace_offset);
        return 1;
    }
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(stop.seen()->when.time_since_epoch());
    fmt::print("{}\n", ns.count());
    return 0;
}

} // namespace

int main(int argc, char** argv)
{
    // stdout carries the restore's one result line; everything else goes to stderr.
    auto logger = spdlog::stderr_color_mt("restore-mechanics-probe");
    logger->set_pattern("restore-mechanics-probe: %^%l%$: %v");
    spdlog::set_default_logger(logger);
    spdlog::set_level(spdlog::level::warn);

    const std::string mode = argc == 3 ? argv[1] : "";
    if (mode != "bake" && mode != "restore" && mode != "restore-jailed") {
        fmt::print(stderr, "usage: restore-mechanics-probe bake DIR | restore DIR | restore-jailed DIR\n");
        return 2;
    }
    try {
        if (mode == "bake") {
            bake(argv[2]);
            return 0;
        }
        if (mode == "restore")
            return restore(argv[2], nullptr);
        VmCgroup cgroup = VmCgroup::create();
        Supervision supervision;
        supervision.cgroup = &cgroup;
        return supervise(supervision, [&] { return restore(argv[2], &cgroup); });
    } catch (const std::exception& e) {
        spdlog::error("{}", e.what());
        return 1;
    }
}
