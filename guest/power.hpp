// Ending the VM from PID 1.
#pragma once

namespace agentvm {

// Stops every process (SIGTERM, a short grace period, SIGKILL), syncs, remounts / read-only,
// prints "power-off" and reboots. The kernel runs with reboot=t, so the reboot is a triple
// fault, which the VMM takes as power-off: without ACPI a real power-off would only halt
// the vCPU. Never returns, since PID 1 returning panics the kernel.
[[noreturn]] void power_off();

} // namespace agentvm
