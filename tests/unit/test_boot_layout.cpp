#include <doctest/doctest.h>

#include <elf.h>

#include <cstring>
#include <vector>

#include "vmm/boot.hpp"
#include "common/error.hpp"
#include "core/layout.hpp"
#include "vmm/vm_config.hpp"

using namespace agentvm;

namespace {

// A minimal x86_64 ELF with one PT_LOAD segment of `code` at paddr, entry at paddr.
std::vector<uint8_t> make_elf(uint64_t paddr, std::vector<uint8_t> code, uint64_t memsz)
{
    const size_t headers = sizeof(Elf64_Ehdr) + sizeof(Elf64_Phdr);
    std::vector<uint8_t> image(headers + code.size());
    Elf64_Ehdr eh{};
    std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
    eh.e_ident[EI_CLASS] = ELFCLASS64;
    eh.e_ident[EI_DATA] = ELFDATA2LSB;
    eh.e_type = ET_EXEC;
    eh.e_machine = EM_X86_64;
    eh.e_entry = paddr;
    eh.e_phoff = sizeof(Elf64_Ehdr);
    eh.e_phentsize = sizeof(Elf64_Phdr);
    eh.e_phnum = 1;
    Elf64_Phdr ph{};
    ph.p_type = PT_LOAD;
    ph.p_offset = headers;
    ph.p_paddr = paddr;
    ph.p_filesz = code.size();
    ph.p_memsz = memsz;
    std::memcpy(image.data(), &eh, sizeof(eh));
    std::memcpy(image.data() + sizeof(eh), &ph, sizeof(ph));
    std::memcpy(image.data() + headers, code.data(), code.size());
    return image;
}

std::vector<uint8_t> make_bzimage(uint16_t version, uint8_t xloadflags)
{
    std::vector<uint8_t> image(5 * 512 + 4096, 0x90);
    setup_header h{};
    h.setup_sects = 4;
    h.boot_flag = 0xaa55;
    h.header = 0x53726448;
    h.version = version;
    h.xloadflags = xloadflags;
    h.cmdline_size = 255;
    h.init_size = 0x10000;
    std::memcpy(image.data() + 0x1f1, &h, sizeof(h));
    return image;
}

} // namespace

TEST_CASE("an ELF vmlinux loads at its physical address and zero-fills its bss")
{
    GuestMemory mem(64 * layout::mib);
    mem.write_obj<uint32_t>(16 * layout::mib + 4, 0xdeadbeef);
    const auto image = make_elf(16 * layout::mib, {0xf4, 0xf4, 0xf4, 0xf4}, 8);
    const auto k = load_kernel(mem, image);
    CHECK(k.entry == 16 * layout::mib);
    CHECK(k.load_end == 16 * layout::mib + 8);
    CHECK_FALSE(k.is_bzimage);
    CHECK(mem.read_obj<uint32_t>(16 * layout::mib) == 0xf4f4f4f4);
    CHECK(mem.read_obj<uint32_t>(16 * layout::mib + 4) == 0);
    CHECK(minimum_ram_for(image) > 16 * layout::mib);
}

TEST_CASE("malformed kernels are refused with a reason")
{
    GuestMemory mem(32 * layout::mib);
    auto elf = make_elf(16 * layout::mib, {1, 2, 3, 4}, 4);
    SUBCASE("truncated segment")
    {
        elf.resize(elf.size() - 2);
        CHECK_THROWS_AS(load_kernel(mem, elf), Error);
    }
    SUBCASE("segment beyond RAM")
    {
        auto big = make_elf(31 * layout::mib, {1}, 2 * layout::mib);
        CHECK_THROWS_WITH_AS(load_kernel(mem, big), doctest::Contains("does not fit"), Error);
    }
    SUBCASE("segment below 1 MiB")
    {
        auto low = make_elf(0x1000, {1}, 1);
        CHECK_THROWS_AS(load_kernel(mem, low), Error);
    }
    SUBCASE("not a kernel at all")
    {
        std::vector<uint8_t> text(4096, 'x');
        CHECK_THROWS_WITH_AS(load_kernel(mem, text), doctest::Contains("neither an ELF"), Error);
        std::vector<uint8_t> tiny{'h', 'i', '\n'};
        CHECK_THROWS_WITH_AS(load_kernel(mem, tiny), doctest::Contains("neither an ELF"), Error);
        CHECK_THROWS_WITH_AS(minimum_ram_for(tiny), doctest::Contains("neither an ELF"), Error);
    }
    SUBCASE("32-bit-only bzImage")
    {
        CHECK_THROWS_WITH_AS(load_kernel(mem, make_bzimage(0x20f, 0)), doctest::Contains("64-bit"), Error);
    }
}

TEST_CASE("a bzImage loads its protected-mode part at 1 MiB, entry at +0x200")
{
    GuestMemory mem(32 * layout::mib);
    const auto k = load_kernel(mem, make_bzimage(0x20f, XLF_KERNEL_64));
    CHECK(k.is_bzimage);
    CHECK(k.entry == layout::high_ram_start + 0x200);
    CHECK(k.load_end == layout::high_ram_start + 0x10000);
    CHECK(mem.read_obj<uint8_t>(layout::high_ram_start) == 0x90);
}

TEST_CASE("e820 map: low RAM below the EBDA, high RAM from 1 MiB, RAM above 4 GiB")
{
    GuestMemory small(64 * layout::mib);
    auto map = e820_map(small);
    REQUIRE(map.size() == 2);
    CHECK(uint64_t{map[0].addr} == 0);
    CHECK(uint64_t{map[0].size} == layout::ebda_start);
    CHECK(uint64_t{map[1].addr} == layout::high_ram_start);
    CHECK(uint64_t{map[1].addr} + map[1].size == 64 * layout::mib);

    GuestMemory big(layout::mmio_gap_start + layout::gib);
    map = e820_map(big);
    REQUIRE(map.size() == 3);
    CHECK(uint64_t{map[1].addr} + map[1].size == layout::mmio_gap_start);
    CHECK(uint64_t{map[2].addr} == layout::mmio_gap_end);
    CHECK(uint64_t{map[2].size} == layout::gib);
}

TEST_CASE("zero page, command line, page tables and GDT")
{
    GuestMemory mem(64 * layout::mib);
    const auto k = load_kernel(mem, make_elf(16 * layout::mib, {0xf4}, 1));
    write_boot_data(mem, k, "console=ttyS0 quiet");
    const auto params = mem.read_obj<boot_params>(layout::boot_params);
    CHECK(+params.hdr.boot_flag == 0xaa55);
    CHECK(+params.hdr.header == 0x53726448);
    CHECK(+params.hdr.type_of_loader == 0xff);
    CHECK(+params.hdr.cmd_line_ptr == layout::cmdline);
    CHECK(params.e820_entries == 2);
    CHECK(std::string(reinterpret_cast<const char*>(mem.span(layout::cmdline, 20).data())) ==
          "console=ttyS0 quiet");
    CHECK(mem.read_obj<uint64_t>(layout::pml4) == (layout::pdpte | 3));
    CHECK(mem.read_obj<uint64_t>(layout::pde + 8) == ((1u << 21) | 0x83));
    // The MMIO window at 3.25 GiB is mapped too (4th page directory).
    CHECK(mem.read_obj<uint64_t>(layout::pdpte + 3 * 8) == ((layout::pde + 3 * 4096) | 3));
    CHECK(mem.read_obj<uint64_t>(layout::pde + 3 * 4096 + 8 * 128) ==
          ((3ull << 30) | (128ull << 21) | 0x83));

    kvm_sregs sregs{};
    set_boot_sregs(sregs);
    CHECK(sregs.cs.selector == 0x10);
    CHECK(sregs.cs.l == 1);
    CHECK(sregs.ds.selector == 0x18);
    CHECK(sregs.cr3 == layout::pml4);
    CHECK((sregs.efer & 0x500) == 0x500);
    const auto regs = boot_regs(k);
    CHECK(regs.rip == k.entry);
    CHECK(regs.rsi == layout::boot_params);
}

TEST_CASE("a command line longer than the kernel accepts is refused, not truncated")
{
    GuestMemory mem(64 * layout::mib);
    const auto k = load_kernel(mem, make_elf(16 * layout::mib, {0xf4}, 1));
    CHECK_THROWS_WITH_AS(write_boot_data(mem, k, std::string(3000, 'a')),
                         doctest::Contains("command line"), Error);
}

TEST_CASE("guest command line carries the init command base64-encoded")
{
    VmConfig config;
    config.rootfs_path = "/x";
    config.init_cmd = "echo \"hi\"";
    config.extra_cmdline = "loglevel=7";
    const auto line = guest_cmdline(config, "virtio_mmio.device=4K@0xd0000000:5");
    CHECK(line.find("root=/dev/vda") != std::string::npos);
    CHECK(line.find("reboot=t") != std::string::npos);
    CHECK(line.find("agentvm.init_cmd=ZWNobyAiaGki") != std::string::npos);
    CHECK(line.rfind("loglevel=7") == line.size() - 10);
    // The default tool-call pids limit is the guest's own; another one travels on the line.
    CHECK(line.find("agentvm.pids_max") == std::string::npos);
    config.guest_pids_max = 64;
    CHECK(guest_cmdline(config, "").find(" agentvm.pids_max=64 ") != std::string::npos);
}
