#include <doctest/doctest.h>

#include <cstring>

#include "common/error.hpp"
#include "core/layout.hpp"
#include "vmm/mptable.hpp"

using namespace agentvm;

namespace {

uint8_t sum(std::span<const uint8_t> bytes)
{
    uint8_t s = 0;
    for (auto b : bytes)
        s = static_cast<uint8_t>(s + b);
    return s;
}

} // namespace

TEST_CASE("floating pointer and configuration table are valid for Linux's MP parser")
{
    GuestMemory mem(16 * layout::mib);
    write_mptable(mem, 4);
    auto fp = mem.span(layout::ebda_start, 16);
    CHECK(std::memcmp(fp.data(), "_MP_", 4) == 0);
    CHECK(sum(fp) == 0);
    const auto table_addr = mem.read_obj<uint32_t>(layout::ebda_start + 4);
    CHECK(table_addr == layout::ebda_start + 16);
    auto hdr = mem.span(table_addr, 44);
    CHECK(std::memcmp(hdr.data(), "PCMP", 4) == 0);
    const auto length = mem.read_obj<uint16_t>(table_addr + 4);
    CHECK(sum(mem.span(table_addr, length)) == 0);
    const auto entries = mem.read_obj<uint16_t>(table_addr + 34);
    CHECK(entries == 4 + 1 + 1 + 24 + 2);
    CHECK(mem.read_obj<uint32_t>(table_addr + 36) == layout::lapic_base);
    // 4 processor entries of 20 bytes + 28 entries of 8 bytes.
    CHECK(length == 44 + 4 * 20 + 28 * 8);

    // First processor is the bootstrap processor, the others are only enabled.
    uint64_t p = table_addr + 44;
    CHECK(mem.read_obj<uint8_t>(p) == 0);
    CHECK(mem.read_obj<uint8_t>(p + 3) == 3);
    CHECK(mem.read_obj<uint8_t>(p + 20 + 1) == 1);
    CHECK(mem.read_obj<uint8_t>(p + 20 + 3) == 1);
    // After the CPUs: ISA bus, then the IOAPIC with the next ID and its address.
    const uint64_t ioapic = p + 4 * 20 + 8;
    CHECK(mem.read_obj<uint8_t>(ioapic) == 2);
    CHECK(mem.read_obj<uint8_t>(ioapic + 1) == 4);
    CHECK(mem.read_obj<uint32_t>(ioapic + 4) == layout::ioapic_base);
}

TEST_CASE("vCPU counts outside what the table can describe are refused")
{
    GuestMemory mem(16 * layout::mib);
    CHECK_THROWS_AS(write_mptable(mem, 0), Error);
    CHECK_THROWS_AS(write_mptable(mem, 255), Error);
    CHECK_NOTHROW(write_mptable(mem, 254));
}
