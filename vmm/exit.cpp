#include "vmm/exit.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/layout.hpp"

namespace agentvm {
namespace {

// Writing this to the i8042 command port pulses the CPU reset line: Linux does it for
// reboot=k, and so do firmware and bootloaders. Without ACPI it is how a guest says "stop".
constexpr uint8_t i8042_reset_command = 0xfe;

template <class... Fs>
struct Overloaded : Fs... {
    using Fs::operator()...;
};
template <class... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

ExitOutcome handle_pio(const PioExit& io, const Bus& pio)
{
    for (uint32_t i = 0; i < io.count; ++i) {
        auto chunk = io.data.subspan(size_t{i} * io.size, io.size);
        if (io.is_write) {
            if (io.port == layout::i8042_command_port && io.size == 1 && chunk[0] == i8042_reset_command)
                return {ExitAction::power_off, "guest reset through the i8042 controller"};
            if (!pio.write(io.port, chunk))
                SPDLOG_TRACE("unclaimed port write {:#x}", io.port);
        } else if (!pio.read(io.port, chunk)) {
            // No device: the i8042 status port reads as "idle" so the kernel's reset path does
            // not spin; every other port floats high, as on real hardware.
            std::fill(chunk.begin(), chunk.end(), io.port == layout::i8042_command_port ? 0x00 : 0xff);
        }
    }
    return {ExitAction::resume, {}};
}

ExitOutcome handle_mmio(const MmioExit& m, const Bus& mmio)
{
    if (m.is_write) {
        if (!mmio.write(m.addr, m.data))
            SPDLOG_DEBUG("unclaimed MMIO write at {:#x}", m.addr);
    } else if (!mmio.read(m.addr, m.data)) {
        std::fill(m.data.begin(), m.data.end(), 0xff);
    }
    return {ExitAction::resume, {}};
}

} // namespace

Exit decode_exit(kvm_run& run, size_t run_size)
{
    switch (run.exit_reason) {
    case KVM_EXIT_IO: {
        const uint64_t bytes = uint64_t{run.io.size} * run.io.count;
        if (run.io.size == 0 || run.io.size > 4 || run.io.data_offset > run_size ||
            bytes > run_size - run.io.data_offset)
            return FailedExit{fmt::format("KVM reported a port I/O exit with an impossible layout "
                                          "(size {}, count {}, offset {})",
                                          run.io.size, run.io.count, run.io.data_offset)};
        // SAFETY: offset and size * count were checked against the kvm_run mapping above.
        auto* base = reinterpret_cast<uint8_t*>(&run) + run.io.data_offset;
        return PioExit{run.io.port, run.io.size, run.io.count,
                       run.io.direction == KVM_EXIT_IO_OUT, {base, static_cast<size_t>(bytes)}};
    }
    case KVM_EXIT_MMIO:
        if (run.mmio.len == 0 || run.mmio.len > sizeof(run.mmio.data))
            return FailedExit{fmt::format("KVM reported an MMIO exit of length {}", run.mmio.len)};
        return MmioExit{run.mmio.phys_addr, run.mmio.is_write != 0, {run.mmio.data, run.mmio.len}};
    case KVM_EXIT_SHUTDOWN:
        return ShutdownExit{"triple fault"};
    case KVM_EXIT_SYSTEM_EVENT:
        return ShutdownExit{fmt::format("system event {}", run.system_event.type)};
    case KVM_EXIT_HLT:
        return IgnoredExit{};
    case KVM_EXIT_INTR:
        return InterruptedExit{};
    case KVM_EXIT_FAIL_ENTRY:
        return FailedExit{fmt::format("KVM could not enter the guest (hardware reason {:#x})",
                                      run.fail_entry.hardware_entry_failure_reason)};
    case KVM_EXIT_INTERNAL_ERROR:
        return FailedExit{fmt::format("KVM internal error (suberror {})", run.internal.suberror)};
    default:
        return FailedExit{fmt::format("unexpected KVM exit reason {}", run.exit_reason)};
    }
}

ExitOutcome handle_exit(const Exit& exit, const Bus& pio, const Bus& mmio)
{
    return std::visit(
        Overloaded{
            [&](const PioExit& io) { return handle_pio(io, pio); },
            [&](const MmioExit& m) { return handle_mmio(m, mmio); },
            [](const ShutdownExit& s) { return ExitOutcome{ExitAction::power_off, s.why}; },
            [](const InterruptedExit&) { return ExitOutcome{ExitAction::check_stop, {}}; },
            [](const FailedExit& f) { return ExitOutcome{ExitAction::fail, f.why}; },
            [](const IgnoredExit&) { return ExitOutcome{ExitAction::resume, {}}; },
        },
        exit);
}

} // namespace agentvm
