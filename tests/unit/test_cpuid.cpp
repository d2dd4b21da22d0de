#include <doctest/doctest.h>

#include <vector>

#include "vmm/cpuid.hpp"

using namespace agentvm;

namespace {

kvm_cpuid_entry2 leaf(uint32_t function, uint32_t index = 0, uint32_t eax = 0, uint32_t ebx = 0,
                      uint32_t ecx = 0, uint32_t edx = 0)
{
    kvm_cpuid_entry2 e{};
    e.function = function;
    e.index = index;
    e.eax = eax;
    e.ebx = ebx;
    e.ecx = ecx;
    e.edx = edx;
    return e;
}

const kvm_cpuid_entry2& find(const std::vector<kvm_cpuid_entry2>& v, uint32_t fn, uint32_t idx = 0)
{
    for (const auto& e : v)
        if (e.function == fn && e.index == idx)
            return e;
    FAIL("leaf missing");
    return v.front();
}

std::vector<kvm_cpuid_entry2> sample()
{
    return {
        leaf(0x1, 0, 0x000806ec, 0xffffffff, 0x0, 0x10000000),
        leaf(0x4, 0, 0xfc004121),  // L1d: type 1, level 1, garbage core count
        leaf(0x4, 3, 0xfc03c163),  // L3: level 3
        leaf(0xa, 0, 0x07300805, 1, 2, 3),
        leaf(0xb, 0, 9, 9, 9, 9),
        leaf(0xb, 1, 9, 9, 9, 9),
        leaf(0xb, 2, 9, 9, 9, 9),
        leaf(0x80000008, 0, 0x3030, 0, 0xffff, 0),
        leaf(0x40000001, 0, 0x7eff, 0, 0, 0),  // every KVM feature 0-14 but 8
    };
}

} // namespace

TEST_CASE("leaf 1 carries the APIC ID, CPU count and the hypervisor bit")
{
    auto out = adjust_cpuid(sample(), {3, 4, true});
    const auto& l1 = find(out, 0x1);
    CHECK((l1.ebx >> 24) == 3);
    CHECK(((l1.ebx >> 16) & 0xff) == 4);
    CHECK(((l1.ebx >> 8) & 0xff) == 8);
    CHECK((l1.ecx & (1u << 31)) != 0);
    CHECK((l1.ecx & (1u << 24)) != 0);
    CHECK((l1.edx & (1u << 28)) != 0);
}

TEST_CASE("one vCPU clears HTT and leaves TSC-deadline off when KVM lacks it")
{
    auto out = adjust_cpuid(sample(), {0, 1, false});
    const auto& l1 = find(out, 0x1);
    CHECK((l1.edx & (1u << 28)) == 0);
    CHECK((l1.ecx & (1u << 24)) == 0);
    CHECK((l1.ebx >> 24) == 0);
}

TEST_CASE("extended topology describes one socket of N cores")
{
    auto out = adjust_cpuid(sample(), {2, 6, false});
    const auto& smt = find(out, 0xb, 0);
    const auto& core = find(out, 0xb, 1);
    const auto& end = find(out, 0xb, 2);
    CHECK(smt.eax == 0);
    CHECK(smt.ebx == 1);
    CHECK(smt.ecx == 0x100);
    CHECK(core.eax == 3);  // 6 cores need 3 APIC-ID bits
    CHECK(core.ebx == 6);
    CHECK(core.ecx == 0x201);
    CHECK(end.ebx == 0);
    CHECK(end.ecx == 2);
    CHECK(smt.edx == 2);
    CHECK(end.edx == 2);
}

TEST_CASE("cache leaves report the vCPU count and the PMU is hidden")
{
    auto out = adjust_cpuid(sample(), {0, 2, false});
    CHECK((find(out, 0x4, 0).eax >> 26) == 1);
    CHECK(((find(out, 0x4, 0).eax >> 14) & 0xfff) == 0);  // L1 private to a core
    CHECK(((find(out, 0x4, 3).eax >> 14) & 0xfff) == 1);  // L3 shared by both
    const auto& pmu = find(out, 0xa);
    CHECK(pmu.eax == 0);
    CHECK(pmu.ebx == 0);
    CHECK((find(out, 0x80000008).ecx & 0xff) == 1);
}

TEST_CASE("the KVM feature leaf keeps every feature but asynchronous page faults")
{
    auto out = adjust_cpuid(sample(), {0, 1, false});
    // Bits 4, 10 and 14: ASYNC_PF, ASYNC_PF_VMEXIT, ASYNC_PF_INT.
    CHECK(find(out, 0x40000001).eax == (0x7effu & ~((1u << 4) | (1u << 10) | (1u << 14))));
}
