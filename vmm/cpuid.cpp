#include "vmm/cpuid.hpp"

#include <asm/kvm_para.h>

#include <bit>

namespace agentvm {
namespace {

constexpr uint32_t leaf_features = 0x1;
constexpr uint32_t leaf_cache = 0x4;
constexpr uint32_t leaf_pmu = 0xa;
constexpr uint32_t leaf_topology = 0xb;
constexpr uint32_t leaf_topology_v2 = 0x1f;
constexpr uint32_t leaf_amd_size = 0x80000008;
constexpr uint32_t leaf_kvm_features = KVM_CPUID_FEATURES;

constexpr uint32_t ecx_tsc_deadline = 1u << 24;
constexpr uint32_t ecx_hypervisor = 1u << 31;
constexpr uint32_t edx_htt = 1u << 28;
constexpr uint32_t kvm_async_page_faults =
    (1u << KVM_FEATURE_ASYNC_PF) | (1u << KVM_FEATURE_ASYNC_PF_VMEXIT) | (1u << KVM_FEATURE_ASYNC_PF_INT);

// Topology level types in leaf 0xB ECX[15:8].
constexpr uint32_t level_smt = 1;
constexpr uint32_t level_core = 2;

uint32_t bits_for(uint32_t count)
{
    return count <= 1 ? 0 : static_cast<uint32_t>(std::bit_width(count - 1));
}

void adjust_topology(kvm_cpuid_entry2& e, const CpuidOptions& o)
{
    // Every vCPU is one core of one socket: SMT level holds 1 thread, core level holds N.
    e.edx = o.vcpu_index;  // x2APIC ID
    switch (e.index) {
    case 0:
        e.eax = 0;
        e.ebx = 1;
        e.ecx = (level_smt << 8) | e.index;
        break;
    case 1:
        e.eax = bits_for(o.vcpu_count);
        e.ebx = o.vcpu_count;
        e.ecx = (level_core << 8) | e.index;
        break;
    default:
        e.eax = 0;
        e.ebx = 0;
        e.ecx = e.index;
        break;
    }
}

} // namespace

std::vector<kvm_cpuid_entry2> adjust_cpuid(std::vector<kvm_cpuid_entry2> entries,
                                           const CpuidOptions& o)
{
    for (auto& e : entries) {
        switch (e.function) {
        case leaf_features:
            // EBX: [31:24] initial APIC ID, [23:16] logical processors per package,
            // [15:8] CLFLUSH line size in quadwords.
            e.ebx = (o.vcpu_index << 24) | (o.vcpu_count << 16) | (8u << 8) | (e.ebx & 0xff);
            e.ecx |= ecx_hypervisor;
            if (o.tsc_deadline)
                e.ecx |= ecx_tsc_deadline;
            if (o.vcpu_count > 1)
                e.edx |= edx_htt;
            else
                e.edx &= ~edx_htt;
            break;
        case leaf_cache:
            // EAX[31:26]: cores per package - 1; EAX[25:14]: threads sharing this cache - 1.
            // Private caches (L1, L2) are per core; the last level is shared by all.
            e.eax &= 0x3fff;
            e.eax |= (o.vcpu_count - 1) << 26;
            if (((e.eax >> 5) & 0x7) >= 3)
                e.eax |= (o.vcpu_count - 1) << 14;
            break;
        case leaf_pmu:
            // No virtual PMU: the guest would otherwise probe performance MSRs, each an exit.
            e.eax = e.ebx = e.ecx = e.edx = 0;
            break;
        case leaf_topology:
        case leaf_topology_v2:
            adjust_topology(e, o);
            break;
        case leaf_kvm_features:
            // No asynchronous page faults: the vCPU waits for a page the host must read in
            // instead of KVM injecting a "page not present" #PF for the guest to schedule around.
            // A snapshot-restored guest takes its first touches of memory from the snapshot file;
            // an injected #PF there is one more event to order against the guest's own interrupt
            // entry, a kernel double fault (#PF at a non-faulting instruction before SWAPGS) was
            // seen under the test host's nested emulation, and an agent VM has no second task
            // worth running meanwhile.
            e.eax &= ~kvm_async_page_faults;
            break;
        case leaf_amd_size:
            // ECX[7:0]: number of cores - 1 (AMD); [15:12] APIC ID size in bits.
            e.ecx = (bits_for(o.vcpu_count) << 12) | (o.vcpu_count - 1);
            break;
        default:
            break;
        }
    }
    return entries;
}

} // namespace agentvm
