// The Intel MultiProcessor table (MP spec 1.4, chapter 4): how a guest without ACPI learns
// its CPUs, its IOAPIC and how ISA interrupts are wired. Written at the EBDA, where Linux's
// smp_scan_config() looks for the floating pointer.
#pragma once

#include <cstdint>

#include "core/guest_memory.hpp"

namespace agentvm {

// APIC IDs are 8 bits, 0xff is the broadcast ID and the IOAPIC takes the ID after the last CPU.
inline constexpr uint32_t mptable_max_vcpus = 254;

// Throws Error if the table does not fit below the BIOS area.
void write_mptable(const GuestMemory& mem, uint32_t vcpu_count);

} // namespace agentvm
