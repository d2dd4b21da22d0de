#include "vmm/vcpu_state.hpp"

#include <sys/ioctl.h>

#include <algorithm>
#include <cerrno>
#include <span>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "vmm/kvm_abi.hpp"
#include "vmm/kvm.hpp"

namespace agentvm {
namespace {

constexpr uint32_t msr_ia32_tsc_deadline = 0x6e0;

// msr_io() in arch/x86/kvm/x86.c refuses MAX_IO_MSRS (256) entries or more in one call.
constexpr size_t max_msrs_per_call = 255;

// MSRs that KVM emulates but leaves out of KVM_GET_MSR_INDEX_LIST. Firecracker adds the same
// ones when CPUID announces the feature (msrs_to_save_by_cpuid in its cpuid/common.rs): the
// MTRRs, which agentvm itself programs at boot (boot_msrs()) and Linux reads back, and the
// 32 machine-check banks KVM gives every vCPU, whose controls Linux sets at boot.
std::vector<uint32_t> unlisted_msrs()
{
    std::vector<uint32_t> msrs;
    for (uint32_t i = 0x200; i < 0x210; ++i)  // IA32_MTRR_PHYSBASE0..PHYSMASK7
        msrs.push_back(i);
    for (uint32_t i : {0x250u, 0x258u, 0x259u})  // IA32_MTRR_FIX64K_00000, FIX16K_*
        msrs.push_back(i);
    for (uint32_t i = 0x268; i < 0x270; ++i)  // IA32_MTRR_FIX4K_*
        msrs.push_back(i);
    msrs.push_back(0x2ff);  // IA32_MTRR_DEF_TYPE
    for (uint32_t i = 0x400; i < 0x480; ++i)  // IA32_MC0_CTL..IA32_MC31_MISC
        msrs.push_back(i);
    return msrs;
}

std::vector<uint32_t> msr_index_list(const Kvm& kvm)
{
    // Asked with room for none, KVM answers E2BIG and says how many there are.
    kvm_abi::MsrListHeader count{};
    if (::ioctl(kvm.fd(), kvm_abi::get_msr_index_list, &count) == 0)
        return {};
    if (errno != E2BIG)
        throw_errno("KVM_GET_MSR_INDEX_LIST");
    kvm_abi::MsrIndexArray list(count.nmsrs);
    list.header().nmsrs = count.nmsrs;
    kvm_ioctl(kvm.fd(), kvm_abi::get_msr_index_list, list.data(), "KVM_GET_MSR_INDEX_LIST");
    auto indices = list.entries().first(std::min(list.header().nmsrs, count.nmsrs));
    return {indices.begin(), indices.end()};
}

// Every MSR KVM lists or emulates that this vCPU can read, as cloud-hypervisor does
// (hypervisor/src/kvm/mod.rs, state()): KVM_GET_MSRS stops at the first MSR it cannot read
// and returns how many it read, so that one is left out and the read goes on after it. What
// KVM can read depends on the vCPU's CPUID (PMU counters, for one), so no fixed list fits.
std::vector<Msr> get_msrs(const Kvm& kvm, int fd)
{
    std::vector<uint32_t> indices = msr_index_list(kvm);
    const auto extra = unlisted_msrs();
    indices.insert(indices.end(), extra.begin(), extra.end());
    std::sort(indices.begin(), indices.end());
    indices.erase(std::unique(indices.begin(), indices.end()), indices.end());
    if (indices.size() > max_msrs)
        throw Error(fmt::format("KVM_GET_MSR_INDEX_LIST: {} MSRs, more than the {} a vCPU state holds",
                                indices.size(), max_msrs));

    std::vector<Msr> msrs;
    for (size_t next = 0; next < indices.size();) {
        const size_t n = std::min(indices.size() - next, max_msrs_per_call);
        kvm_abi::MsrArray batch(n);
        batch.header().nmsrs = static_cast<uint32_t>(n);
        for (size_t i = 0; i < n; ++i)
            batch.entries()[i].index = indices[next + i];
        const int read = ::ioctl(fd, kvm_abi::get_msrs, batch.data());
        if (read < 0)
            throw_errno("KVM_GET_MSRS");
        const auto got = static_cast<size_t>(read);
        for (const auto& entry : batch.entries().first(std::min(got, n)))
            msrs.push_back({entry.index, entry.data});
        next += got;
        if (got < n) {
            SPDLOG_DEBUG("KVM_GET_MSRS cannot read MSR {:#x}; it is not saved", indices[next]);
            ++next;
        }
    }
    return msrs;
}

void set_msrs(int fd, std::span<const Msr> msrs)
{
    for (size_t done = 0; done < msrs.size();) {
        const size_t n = std::min(msrs.size() - done, max_msrs_per_call);
        kvm_abi::MsrArray batch(n);
        batch.header().nmsrs = static_cast<uint32_t>(n);
        for (size_t i = 0; i < n; ++i) {
            batch.entries()[i].index = msrs[done + i].index;
            batch.entries()[i].data = msrs[done + i].value;
        }
        // KVM stops at the first MSR it refuses and returns how many it set before it.
        const int set = ::ioctl(fd, kvm_abi::set_msrs, batch.data());
        if (set < 0)
            throw_errno("KVM_SET_MSRS");
        if (static_cast<size_t>(set) < n) {
            const Msr& refused = msrs[done + static_cast<size_t>(set)];
            throw Error(fmt::format("KVM_SET_MSRS: KVM refused MSR {:#x} = {:#x}", refused.index,
                                    refused.value));
        }
        done += n;
    }
}

// The XSAVE area KVM keeps for this process's vCPUs. KVM_CAP_XSAVE2 (Linux 5.17) reports it,
// larger than the legacy 4 KiB once the process has been granted AMX; without it, 4 KiB.
size_t xsave_bytes(const Kvm& kvm)
{
    const int size = kvm.check_extension(KVM_CAP_XSAVE2);
    return std::max(min_xsave_bytes, size > 0 ? static_cast<size_t>(size) : 0);
}

std::vector<uint8_t> get_xsave(const Kvm& kvm, int fd)
{
    std::vector<uint8_t> area(xsave_bytes(kvm));
    if (area.size() > max_xsave_bytes)
        throw Error(fmt::format("KVM_CAP_XSAVE2: an XSAVE area of {} bytes, more than the {} a "
                                "vCPU state holds", area.size(), max_xsave_bytes));
    // KVM_GET_XSAVE refuses an area larger than 4 KiB; KVM_GET_XSAVE2 writes all of it.
    if (kvm.check_extension(KVM_CAP_XSAVE2) > 0)
        kvm_ioctl(fd, kvm_abi::get_xsave2, area.data(), "KVM_GET_XSAVE2");
    else
        kvm_ioctl(fd, kvm_abi::get_xsave, area.data(), "KVM_GET_XSAVE");
    return area;
}

void set_xsave(const Kvm& kvm, int fd, const std::vector<uint8_t>& saved)
{
    // KVM_SET_XSAVE copies the vCPU's whole XSAVE area from us, however long it is
    // (kvm_arch_vcpu_ioctl(), arch/x86/kvm/x86.c), so the buffer must be at least that long
    // or KVM would read past it. A shorter saved area is padded with zeros: components its
    // XSTATE_BV header does not mark as present are loaded in their initial state.
    const size_t size = xsave_bytes(kvm);
    if (saved.size() > size)
        throw Error(fmt::format("KVM_SET_XSAVE: the saved XSAVE area has {} bytes, this host's "
                                "vCPUs {}: saved on a different CPU?", saved.size(), size));
    std::vector<uint8_t> area(saved);
    area.resize(size);
    kvm_ioctl(fd, kvm_abi::set_xsave, area.data(), "KVM_SET_XSAVE");
}

std::vector<kvm_cpuid_entry2> get_cpuid(int fd)
{
    // KVM_GET_CPUID2 needs room for every entry (E2BIG otherwise) and says how many it wrote.
    kvm_abi::CpuidArray cpuid(max_cpuid_entries);
    cpuid.header().nent = static_cast<uint32_t>(max_cpuid_entries);
    kvm_ioctl(fd, kvm_abi::get_cpuid2, cpuid.data(), "KVM_GET_CPUID2");
    auto entries = cpuid.entries().first(std::min<size_t>(cpuid.header().nent, max_cpuid_entries));
    return {entries.begin(), entries.end()};
}

void set_cpuid(int fd, const std::vector<kvm_cpuid_entry2>& entries)
{
    if (entries.size() > max_cpuid_entries)
        throw Error(fmt::format("KVM_SET_CPUID2: {} entries, more than KVM takes ({})",
                                entries.size(), max_cpuid_entries));
    kvm_abi::CpuidArray cpuid(entries.size());
    cpuid.header().nent = static_cast<uint32_t>(entries.size());
    std::copy(entries.begin(), entries.end(), cpuid.entries().begin());
    kvm_ioctl(fd, kvm_abi::set_cpuid2, cpuid.data(), "KVM_SET_CPUID2");
}

} // namespace

VcpuState save_vcpu_state(const Kvm& kvm, int vcpu_fd)
{
    // The order is Firecracker's and cloud-hypervisor's (vcpu.rs save_state(), kvm/mod.rs
    // state()): KVM_GET_MP_STATE first, because it runs kvm_apic_accept_events(), which can
    // change the vCPU and LAPIC state the other reads return; KVM_GET_VCPU_EVENTS last,
    // because the other GET ioctls may touch the pending events it reports.
    VcpuState state;
    kvm_ioctl(vcpu_fd, KVM_GET_MP_STATE, &state.mp_state, "KVM_GET_MP_STATE");
    kvm_ioctl(vcpu_fd, KVM_GET_REGS, &state.regs, "KVM_GET_REGS");
    kvm_ioctl(vcpu_fd, KVM_GET_SREGS, &state.sregs, "KVM_GET_SREGS");
    state.xsave = get_xsave(kvm, vcpu_fd);
    kvm_ioctl(vcpu_fd, KVM_GET_XCRS, &state.xcrs, "KVM_GET_XCRS");
    kvm_ioctl(vcpu_fd, KVM_GET_DEBUGREGS, &state.debugregs, "KVM_GET_DEBUGREGS");
    kvm_ioctl(vcpu_fd, KVM_GET_LAPIC, &state.lapic, "KVM_GET_LAPIC");
    state.cpuid = get_cpuid(vcpu_fd);
    state.msrs = get_msrs(kvm, vcpu_fd);
    kvm_ioctl(vcpu_fd, KVM_GET_VCPU_EVENTS, &state.events, "KVM_GET_VCPU_EVENTS");
    return state;
}

void restore_vcpu_state(const Kvm& kvm, int vcpu_fd, const VcpuState& state)
{
    // The order KVM needs, as Firecracker and cloud-hypervisor restore (vcpu.rs
    // restore_state(), kvm/mod.rs set_state()), with the kernel's reasons:
    //  - CPUID first: KVM checks XCR0, the XSAVE components, MSR writes and the LAPIC timer
    //    mode against the guest's CPUID, and refuses to change it once the vCPU has run.
    //  - KVM_SET_REGS clears any pending exception, so it comes before KVM_SET_VCPU_EVENTS,
    //    which restores it; KVM_SET_SREGS re-queues a pending interrupt, so it does too.
    //  - KVM_SET_SREGS sets the APIC base MSR, so it comes before KVM_SET_LAPIC.
    //  - KVM_SET_LAPIC before the MSRs: KVM ignores a write to IA32_TSC_DEADLINE unless the
    //    LAPIC timer is already in TSC-deadline mode (kvm_set_lapic_tscdeadline_msr()).
    //  - IA32_TSC_DEADLINE after IA32_TSC, because KVM arms the deadline timer against the
    //    guest TSC as it is at that write; before it, the timer fires at the wrong time or
    //    never (Firecracker's DEFERRED_MSRS). KVM_SET_MSRS writes in array order.
    //  - KVM_SET_VCPU_EVENTS last, so nothing after it drops what it restores.
    set_cpuid(vcpu_fd, state.cpuid);
    kvm_ioctl(vcpu_fd, KVM_SET_MP_STATE, &state.mp_state, "KVM_SET_MP_STATE");
    kvm_ioctl(vcpu_fd, KVM_SET_REGS, &state.regs, "KVM_SET_REGS");
    kvm_ioctl(vcpu_fd, KVM_SET_SREGS, &state.sregs, "KVM_SET_SREGS");
    set_xsave(kvm, vcpu_fd, state.xsave);
    kvm_ioctl(vcpu_fd, KVM_SET_XCRS, &state.xcrs, "KVM_SET_XCRS");
    kvm_ioctl(vcpu_fd, KVM_SET_DEBUGREGS, &state.debugregs, "KVM_SET_DEBUGREGS");
    kvm_ioctl(vcpu_fd, KVM_SET_LAPIC, &state.lapic, "KVM_SET_LAPIC");
    std::vector<Msr> msrs = state.msrs;
    std::stable_partition(msrs.begin(), msrs.end(),
                          [](const Msr& m) { return m.index != msr_ia32_tsc_deadline; });
    set_msrs(vcpu_fd, msrs);
    kvm_ioctl(vcpu_fd, KVM_SET_VCPU_EVENTS, &state.events, "KVM_SET_VCPU_EVENTS");
}

} // namespace agentvm
