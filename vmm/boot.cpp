#include "vmm/boot.hpp"

#include <asm/e820.h>

#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/fd.hpp"
#include "core/layout.hpp"

namespace agentvm {
namespace {

constexpr uint32_t hdrs_magic = 0x53726448;  // "HdrS"
constexpr uint16_t boot_flag_magic = 0xaa55;
constexpr uint64_t setup_header_offset = 0x1f1;
constexpr uint16_t min_protocol_for_64bit = 0x206;
constexpr uint64_t bzimage_load_addr = layout::high_ram_start;
constexpr uint64_t bzimage_64bit_entry_offset = 0x200;
constexpr uint8_t loader_type_undefined = 0xff;
constexpr uint32_t elf_kernel_alignment = 0x1000000;
constexpr uint64_t default_command_line_size = 2048;
// Room the kernel needs past its image for early page tables, initial allocations and a
// usable system; --mem below load_end + this is refused.
constexpr uint64_t runtime_headroom = 48 * layout::mib;

// GDT selectors the 64-bit boot protocol requires: __BOOT_CS = 0x10, __BOOT_DS = 0x18.
constexpr uint16_t boot_cs = 0x10;
constexpr uint16_t boot_ds = 0x18;
constexpr uint16_t boot_tss = 0x20;

constexpr uint64_t cr0_pe = 1u << 0;
constexpr uint64_t cr0_et = 1u << 4;
constexpr uint64_t cr0_pg = 1u << 31;
constexpr uint64_t cr4_pae = 1u << 5;
constexpr uint64_t efer_lme = 1u << 8;
constexpr uint64_t efer_lma = 1u << 10;

constexpr uint64_t pte_present = 1u << 0;
constexpr uint64_t pte_write = 1u << 1;
constexpr uint64_t pte_huge = 1u << 7;

bool is_elf(std::span<const uint8_t> image)
{
    return image.size() >= SELFMAG && std::memcmp(image.data(), ELFMAG, SELFMAG) == 0;
}

// Refuses, with one message, anything that is neither format, before either parser looks
// at it (so a short text file is not "truncated", just not a kernel).
void require_kernel_format(std::span<const uint8_t> image)
{
    if (is_elf(image))
        return;
    setup_header header{};
    if (image.size() >= setup_header_offset + sizeof(header))
        std::memcpy(&header, image.data() + setup_header_offset, sizeof(header));
    if (header.boot_flag != boot_flag_magic || header.header != hdrs_magic)
        throw Error("kernel is neither an ELF vmlinux nor a bzImage (no ELF magic, no HdrS header)");
}

template <typename T>
T read_at(std::span<const uint8_t> image, uint64_t offset, const char* what)
{
    if (offset > image.size() || sizeof(T) > image.size() - offset)
        throw Error(fmt::format("kernel image is truncated: {} lies beyond its end", what));
    T value;
    std::memcpy(&value, image.data() + offset, sizeof(T));
    return value;
}

void copy_to_guest(const GuestMemory& mem, uint64_t gpa, std::span<const uint8_t> bytes,
                   uint64_t zero_fill)
{
    if (!mem.contains(gpa, bytes.size() + zero_fill))
        throw Error(fmt::format("kernel segment [{:#x}, +{:#x}) does not fit in guest RAM of {} MiB",
                                gpa, bytes.size() + zero_fill, mem.ram_size() / layout::mib));
    mem.write(gpa, bytes);
    auto tail = mem.span(gpa + bytes.size(), zero_fill);
    std::fill(tail.begin(), tail.end(), 0);
}

LoadedKernel load_elf(const GuestMemory& mem, std::span<const uint8_t> image)
{
    const auto ehdr = read_at<Elf64_Ehdr>(image, 0, "the ELF header");
    if (ehdr.e_ident[EI_CLASS] != ELFCLASS64 || ehdr.e_ident[EI_DATA] != ELFDATA2LSB ||
        ehdr.e_machine != EM_X86_64 || ehdr.e_type != ET_EXEC)
        throw Error("kernel ELF is not a little-endian x86_64 executable (expected an x86_64 vmlinux)");
    if (ehdr.e_phentsize != sizeof(Elf64_Phdr) || ehdr.e_phnum == 0)
        throw Error("kernel ELF has no usable program headers");

    LoadedKernel kernel;
    uint64_t lowest = UINT64_MAX;
    for (uint16_t i = 0; i < ehdr.e_phnum; ++i) {
        const auto ph = read_at<Elf64_Phdr>(image, ehdr.e_phoff + uint64_t{i} * sizeof(Elf64_Phdr),
                                            "a program header");
        if (ph.p_type != PT_LOAD)
            continue;
        if (ph.p_filesz > ph.p_memsz || ph.p_offset > image.size() ||
            ph.p_filesz > image.size() - ph.p_offset)
            throw Error("kernel ELF segment lies outside the file: the image is truncated or corrupt");
        if (ph.p_paddr < layout::high_ram_start)
            throw Error(fmt::format("kernel ELF segment loads at {:#x}, below 1 MiB", ph.p_paddr));
        copy_to_guest(mem, ph.p_paddr, image.subspan(ph.p_offset, ph.p_filesz),
                      ph.p_memsz - ph.p_filesz);
        lowest = std::min(lowest, ph.p_paddr);
        kernel.load_end = std::max(kernel.load_end, ph.p_paddr + ph.p_memsz);
    }
    if (kernel.load_end == 0)
        throw Error("kernel ELF has no loadable segment");
    // vmlinux's e_entry is the physical address of startup_64 (ENTRY(phys_startup_64)).
    if (ehdr.e_entry < lowest || ehdr.e_entry >= kernel.load_end)
        throw Error("kernel ELF entry point lies outside its loaded segments");
    kernel.entry = ehdr.e_entry;
    kernel.header.boot_flag = boot_flag_magic;
    kernel.header.header = hdrs_magic;
    kernel.header.kernel_alignment = elf_kernel_alignment;
    return kernel;
}

LoadedKernel load_bzimage(const GuestMemory& mem, std::span<const uint8_t> image)
{
    const auto header = read_at<setup_header>(image, setup_header_offset, "the setup header");
    if (header.version < min_protocol_for_64bit || !(header.xloadflags & XLF_KERNEL_64))
        throw Error(fmt::format("bzImage (boot protocol {:#x}) has no 64-bit entry point",
                                uint16_t{header.version}));
    const uint64_t setup_sects = header.setup_sects == 0 ? 4 : header.setup_sects;
    const uint64_t kernel_offset = (setup_sects + 1) * 512;
    if (kernel_offset >= image.size())
        throw Error("bzImage is truncated: no protected-mode kernel after the setup sectors");

    LoadedKernel kernel;
    kernel.is_bzimage = true;
    kernel.header = header;
    const auto payload = image.subspan(kernel_offset);
    // The decompressor works in place and needs init_size bytes from the load address.
    const uint64_t footprint = std::max<uint64_t>(payload.size(), header.init_size);
    copy_to_guest(mem, bzimage_load_addr, payload, footprint - payload.size());
    kernel.entry = bzimage_load_addr + bzimage_64bit_entry_offset;
    kernel.load_end = bzimage_load_addr + footprint;
    return kernel;
}

constexpr uint64_t gdt_entry(uint16_t flags, uint32_t base, uint32_t limit)
{
    return ((uint64_t{base} & 0xff000000u) << (56 - 24)) | ((uint64_t{flags} & 0xf0ffu) << 40) |
           ((uint64_t{limit} & 0x000f0000u) << (48 - 16)) | ((uint64_t{base} & 0x00ffffffu) << 16) |
           (uint64_t{limit} & 0x0000ffffu);
}

kvm_segment segment_from(uint64_t entry, uint16_t selector)
{
    kvm_segment s{};
    s.base = ((entry >> 16) & 0xffffff) | (((entry >> 56) & 0xff) << 24);
    const uint32_t limit = static_cast<uint32_t>((entry & 0xffff) | (((entry >> 48) & 0xf) << 16));
    s.g = static_cast<uint8_t>((entry >> 55) & 1);
    s.limit = s.g ? (limit << 12) | 0xfff : limit;
    s.selector = selector;
    s.type = static_cast<uint8_t>((entry >> 40) & 0xf);
    s.present = static_cast<uint8_t>((entry >> 47) & 1);
    s.dpl = static_cast<uint8_t>((entry >> 45) & 3);
    s.db = static_cast<uint8_t>((entry >> 54) & 1);
    s.s = static_cast<uint8_t>((entry >> 44) & 1);
    s.l = static_cast<uint8_t>((entry >> 53) & 1);
    s.avl = static_cast<uint8_t>((entry >> 52) & 1);
    s.unusable = s.present ? 0 : 1;
    return s;
}

// Flat 4 GiB segments: code is 64-bit (L=1), data read/write, and a TSS that VMX insists on.
constexpr uint64_t gdt_table[] = {
    0,                                  // null
    0,                                  // unused, keeps __BOOT_CS at 0x10
    gdt_entry(0xa09b, 0, 0xfffff),      // 0x10 code: present, DPL0, exec/read, L, G
    gdt_entry(0xc093, 0, 0xfffff),      // 0x18 data: present, DPL0, read/write, D/B, G
    gdt_entry(0x808b, 0, 0xfffff),      // 0x20 TSS: busy 64-bit TSS
};

} // namespace

std::vector<uint8_t> read_kernel_file(const std::string& path)
{
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd)
        throw_errno(fmt::format("cannot open kernel '{}'", path));
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0)
        throw_errno(fmt::format("cannot stat kernel '{}'", path));
    if (!S_ISREG(st.st_mode))
        throw Error(fmt::format("kernel '{}' is not a regular file", path));
    std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::read(fd.get(), bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            throw_errno(fmt::format("cannot read kernel '{}'", path));
        if (n == 0)
            throw Error(fmt::format("kernel '{}' shrank while being read", path));
        done += static_cast<size_t>(n);
    }
    if (bytes.empty())
        throw Error(fmt::format("kernel '{}' is empty", path));
    return bytes;
}

uint64_t minimum_ram_for(std::span<const uint8_t> image)
{
    require_kernel_format(image);
    uint64_t end = 0;
    if (is_elf(image)) {
        const auto ehdr = read_at<Elf64_Ehdr>(image, 0, "the ELF header");
        for (uint16_t i = 0; i < ehdr.e_phnum; ++i) {
            const auto ph = read_at<Elf64_Phdr>(
                image, ehdr.e_phoff + uint64_t{i} * sizeof(Elf64_Phdr), "a program header");
            if (ph.p_type == PT_LOAD)
                end = std::max(end, ph.p_paddr + ph.p_memsz);
        }
    } else {
        const auto header = read_at<setup_header>(image, setup_header_offset, "the setup header");
        end = bzimage_load_addr + std::max<uint64_t>(image.size(), header.init_size);
    }
    return end + runtime_headroom;
}

LoadedKernel load_kernel(const GuestMemory& mem, std::span<const uint8_t> image)
{
    require_kernel_format(image);
    return is_elf(image) ? load_elf(mem, image) : load_bzimage(mem, image);
}

std::vector<boot_e820_entry> e820_map(const GuestMemory& mem)
{
    std::vector<boot_e820_entry> map;
    // Below 1 MiB only [0, EBDA) is RAM: the EBDA holds our MP table and the BIOS area above
    // it must not be handed out.
    map.push_back({0, layout::low_ram_end, E820_RAM});
    for (const auto& r : mem.regions()) {
        const uint64_t start = std::max(r.gpa, layout::high_ram_start);
        const uint64_t end = r.gpa + r.size;
        if (end > start)
            map.push_back({start, end - start, E820_RAM});
    }
    return map;
}

void write_boot_data(const GuestMemory& mem, const LoadedKernel& kernel, std::string_view cmdline)
{
    // An ELF carries no setup header, so assume x86's COMMAND_LINE_SIZE; a longer line would
    // be cut silently by the kernel.
    const uint64_t cmdline_limit =
        kernel.header.cmdline_size ? std::min<uint64_t>(kernel.header.cmdline_size + 1, layout::cmdline_max)
                                   : default_command_line_size;
    if (cmdline.size() + 1 > cmdline_limit)
        throw Error(fmt::format("kernel command line is {} bytes; this kernel accepts at most {}",
                                cmdline.size(), cmdline_limit - 1));
    auto cmd = mem.span(layout::cmdline, cmdline.size() + 1);
    std::copy(cmdline.begin(), cmdline.end(), cmd.begin());
    cmd[cmdline.size()] = 0;

    boot_params params{};
    params.hdr = kernel.header;
    params.hdr.type_of_loader = loader_type_undefined;
    params.hdr.cmd_line_ptr = static_cast<uint32_t>(layout::cmdline);
    params.ext_cmd_line_ptr = static_cast<uint32_t>(layout::cmdline >> 32);
    params.hdr.cmdline_size = static_cast<uint32_t>(cmdline.size());
    params.hdr.loadflags |= LOADED_HIGH;
    const auto map = e820_map(mem);
    if (map.size() > E820_MAX_ENTRIES_ZEROPAGE)
        throw Error("e820 map has too many entries for the zero page");
    std::copy(map.begin(), map.end(), params.e820_table);
    params.e820_entries = static_cast<uint8_t>(map.size());
    mem.write_obj(layout::boot_params, params);

    // Identity-map the low 4 GiB with 2 MiB pages. Linux's startup_64 needs only its own
    // image mapped and builds its tables at once; freestanding test guests also reach the
    // device window below 4 GiB through this map, and must never fault (PVM hosts cannot
    // deliver exceptions to them).
    mem.write_obj<uint64_t>(layout::pml4, layout::pdpte | pte_present | pte_write);
    for (uint64_t table = 0; table < layout::pde_pages; ++table) {
        const uint64_t pde_table = layout::pde + table * 4096;
        mem.write_obj<uint64_t>(layout::pdpte + table * 8, pde_table | pte_present | pte_write);
        for (uint64_t i = 0; i < 512; ++i) {
            const uint64_t addr = (table << 30) | (i << 21);
            mem.write_obj<uint64_t>(pde_table + i * 8, addr | pte_present | pte_write | pte_huge);
        }
    }

    for (size_t i = 0; i < std::size(gdt_table); ++i)
        mem.write_obj<uint64_t>(layout::boot_gdt + i * 8, gdt_table[i]);
}

kvm_regs boot_regs(const LoadedKernel& kernel)
{
    kvm_regs regs{};
    regs.rip = kernel.entry;
    regs.rsi = layout::boot_params;
    regs.rflags = 0x2;  // bit 1 is reserved and always set
    return regs;
}

void set_boot_sregs(kvm_sregs& sregs)
{
    sregs.gdt.base = layout::boot_gdt;
    sregs.gdt.limit = static_cast<uint16_t>(sizeof(gdt_table) - 1);
    sregs.idt.base = 0;
    sregs.idt.limit = 0;  // interrupts stay off until the kernel loads its own IDT
    sregs.cs = segment_from(gdt_table[boot_cs / 8], boot_cs);
    const kvm_segment data = segment_from(gdt_table[boot_ds / 8], boot_ds);
    sregs.ds = sregs.es = sregs.fs = sregs.gs = sregs.ss = data;
    sregs.tr = segment_from(gdt_table[boot_tss / 8], boot_tss);
    sregs.cr3 = layout::pml4;
    sregs.cr4 |= cr4_pae;
    sregs.cr0 |= cr0_pe | cr0_et | cr0_pg;
    sregs.efer |= efer_lme | efer_lma;
}

kvm_fpu boot_fpu()
{
    kvm_fpu fpu{};
    fpu.fcw = 0x37f;      // x87 default control word: all exceptions masked
    fpu.mxcsr = 0x1f80;   // SSE default: all exceptions masked, round to nearest
    return fpu;
}

} // namespace agentvm
