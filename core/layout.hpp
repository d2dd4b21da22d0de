// The guest-physical address map of every agentvm VM (x86_64). One place, so the e820
// map, the MP table, the device windows and the memory regions cannot disagree.
#pragma once

#include <cstdint>

namespace agentvm::layout {

inline constexpr uint64_t kib = 1024;
inline constexpr uint64_t mib = 1024 * kib;
inline constexpr uint64_t gib = 1024 * mib;
inline constexpr uint64_t page_size = 4096;  // guest and host pages (x86-64, no huge pages)

// Low memory used by the boot path; all below 1 MiB and reserved from the kernel's allocator
// except where e820 says RAM.
inline constexpr uint64_t boot_gdt = 0x500;
inline constexpr uint64_t boot_params = 0x7000;      // struct boot_params, the "zero page"
inline constexpr uint64_t pml4 = 0x9000;             // identity page tables for the 64-bit entry
inline constexpr uint64_t pdpte = 0xa000;
inline constexpr uint64_t pde = 0xb000;             // 4 pages: identity map of 4 GiB
inline constexpr uint64_t pde_pages = 4;
inline constexpr uint64_t cmdline = 0x20000;
inline constexpr uint64_t cmdline_max = 0x10000;     // bytes, NUL included
inline constexpr uint64_t ebda_start = 0x9fc00;      // MP table lives here (MP spec 1.4 §4)
inline constexpr uint64_t low_ram_end = ebda_start;  // e820 RAM [0, ebda_start)
inline constexpr uint64_t bios_area = 0xe0000;       // [bios_area, 1 MiB) reserved
inline constexpr uint64_t high_ram_start = 1 * mib;  // kernel loads here or above

// RAM stops at the 32-bit MMIO gap and continues above 4 GiB.
inline constexpr uint64_t mmio_gap_start = 3 * gib;
inline constexpr uint64_t mmio_gap_end = 4 * gib;

// Devices in the gap.
inline constexpr uint64_t virtio_mmio_base = 0xd0000000;
inline constexpr uint64_t virtio_mmio_size = 0x1000;  // one page per device
inline constexpr uint64_t ioapic_base = 0xfec00000;
inline constexpr uint64_t lapic_base = 0xfee00000;

// Legacy ISA interrupt lines (routed 1:1 to IOAPIC pins).
inline constexpr uint32_t serial_irq = 4;
inline constexpr uint32_t first_virtio_irq = 5;
inline constexpr uint32_t ioapic_pins = 24;

inline constexpr uint16_t com1_port = 0x3f8;
inline constexpr uint16_t com1_ports = 8;
// Port 0x64 (i8042 command): a write of 0xfe is the keyboard-controller reset the kernel
// uses for `reboot=k`; we treat it as the guest powering off.
inline constexpr uint16_t i8042_command_port = 0x64;

} // namespace agentvm::layout
