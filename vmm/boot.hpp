// Linux x86_64 boot: the 64-bit boot protocol (Documentation/x86/boot.rst §"64-bit Boot
// Protocol"). We load an uncompressed vmlinux ELF (fastest: no decompression) or a bzImage,
// write the zero page (struct boot_params) with the e820 map and the command line, build
// identity page tables and a flat GDT, and start the boot vCPU in long mode at the kernel's
// 64-bit entry with RSI pointing at the zero page.
#pragma once

#include <asm/bootparam.h>
#include <linux/kvm.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/guest_memory.hpp"

namespace agentvm {

struct LoadedKernel {
    uint64_t entry = 0;      // guest-physical 64-bit entry point
    uint64_t load_end = 0;   // first byte past everything the kernel image occupies
    bool is_bzimage = false;
    setup_header header{};   // copied from a bzImage; built by us for an ELF
};

// Reads a kernel file; throws Error naming the path and the problem.
std::vector<uint8_t> read_kernel_file(const std::string& path);

// The memory the kernel image needs below it is loaded (its end plus room to run);
// the CLI refuses a --mem smaller than this.
uint64_t minimum_ram_for(std::span<const uint8_t> image);

// Copies the image into guest memory. Throws Error if the image is neither a valid
// x86_64 ELF nor a 64-bit-capable bzImage, or does not fit in RAM.
LoadedKernel load_kernel(const GuestMemory& mem, std::span<const uint8_t> image);

std::vector<boot_e820_entry> e820_map(const GuestMemory& mem);

// Writes the command line, zero page, page tables and GDT. Throws Error if the command line
// is too long for the kernel.
void write_boot_data(const GuestMemory& mem, const LoadedKernel& kernel, std::string_view cmdline);

// Register state of the boot vCPU at the 64-bit entry. sregs is read from KVM first so fields
// we do not set keep KVM's defaults.
kvm_regs boot_regs(const LoadedKernel& kernel);
void set_boot_sregs(kvm_sregs& sregs);
kvm_fpu boot_fpu();

} // namespace agentvm
