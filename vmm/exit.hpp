// vCPU exits as plain data, and the pure function that decides what each one means.
// Tests drive handle_exit() with hand-made exits and buses; no /dev/kvm needed.
#pragma once

#include <linux/kvm.h>

#include <cstdint>
#include <span>
#include <string>
#include <variant>

#include "core/bus.hpp"

namespace agentvm {

struct PioExit {
    uint16_t port;
    uint8_t size;            // bytes per access: 1, 2 or 4
    uint32_t count;          // > 1 for rep ins/outs
    bool is_write;
    std::span<uint8_t> data; // size * count bytes inside the kvm_run page
};

struct MmioExit {
    uint64_t addr;
    bool is_write;
    std::span<uint8_t> data; // 1 to 8 bytes
};

// A triple fault (the kernel's reboot=t path) or a KVM system event.
struct ShutdownExit {
    std::string why;
};

// KVM_RUN returned EINTR: a kick from another thread (stop, pause) or a stray signal.
struct InterruptedExit {};

// Something KVM reports that no device can fix.
struct FailedExit {
    std::string why;
};

// Exits that need nothing from us (e.g. a HLT that KVM reports).
struct IgnoredExit {};

using Exit = std::variant<PioExit, MmioExit, ShutdownExit, InterruptedExit, FailedExit, IgnoredExit>;

// Reads the exit out of the vCPU's kvm_run page. run_size bounds the PIO data offset that
// KVM hands us, so a bad offset cannot point past the mapping.
Exit decode_exit(kvm_run& run, size_t run_size);

enum class ExitAction {
    resume,     // run the vCPU again
    power_off,  // the guest asked to stop (reboot, triple fault, i8042 reset)
    fail,       // unrecoverable: tear the VM down and report why
    check_stop, // interrupted: look at the VM's stop request, then resume
};

struct ExitOutcome {
    ExitAction action;
    std::string why;
};

ExitOutcome handle_exit(const Exit& exit, const Bus& pio, const Bus& mmio);

} // namespace agentvm
