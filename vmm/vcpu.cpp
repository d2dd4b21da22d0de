#include "vmm/vcpu.hpp"

#include <sys/ioctl.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <algorithm>

#include <fmt/format.h>

#include "common/error.hpp"
#include "vmm/kvm_abi.hpp"

namespace agentvm {
namespace {

constexpr uint32_t msr_ia32_tsc = 0x10;
constexpr uint32_t msr_ia32_sysenter_cs = 0x174;
constexpr uint32_t msr_ia32_sysenter_esp = 0x175;
constexpr uint32_t msr_ia32_sysenter_eip = 0x176;
constexpr uint32_t msr_ia32_misc_enable = 0x1a0;
constexpr uint32_t msr_mtrr_def_type = 0x2ff;
constexpr uint32_t msr_star = 0xc0000081;
constexpr uint32_t msr_lstar = 0xc0000082;
constexpr uint32_t msr_cstar = 0xc0000083;
constexpr uint32_t msr_syscall_mask = 0xc0000084;
constexpr uint32_t msr_kernel_gs_base = 0xc0000102;

constexpr uint64_t misc_enable_fast_string = 1;
constexpr uint64_t mtrr_enable = 1u << 11;
constexpr uint64_t mtrr_type_write_back = 6;

// Local APIC register offsets and delivery modes (Intel SDM vol. 3, §10.5.1).
constexpr size_t apic_lvt_lint0 = 0x350;
constexpr size_t apic_lvt_lint1 = 0x360;
constexpr uint32_t delivery_mode_mask = 0x700;
constexpr uint32_t delivery_extint = 0x700;
constexpr uint32_t delivery_nmi = 0x400;

void vcpu_ioctl(int fd, unsigned long request, void* arg, const char* what, uint32_t index)
{
    if (::ioctl(fd, request, arg) < 0)
        throw_errno(fmt::format("{} on vCPU {}", what, index));
}

} // namespace

std::vector<std::pair<uint32_t, uint64_t>> boot_msrs()
{
    return {
        {msr_ia32_sysenter_cs, 0},
        {msr_ia32_sysenter_esp, 0},
        {msr_ia32_sysenter_eip, 0},
        {msr_star, 0},
        {msr_cstar, 0},
        {msr_kernel_gs_base, 0},
        {msr_syscall_mask, 0},
        {msr_lstar, 0},
        {msr_ia32_tsc, 0},
        {msr_ia32_misc_enable, misc_enable_fast_string},
        // Without MTRRs enabled and defaulting to write-back, Linux maps RAM uncached.
        {msr_mtrr_def_type, mtrr_enable | mtrr_type_write_back},
    };
}

Vcpu::Vcpu(const Kvm& kvm, int vm_fd, uint32_t index) : index_(index)
{
    fd_ = Fd(::ioctl(vm_fd, KVM_CREATE_VCPU, static_cast<unsigned long>(index)));
    if (!fd_)
        throw_errno(fmt::format("KVM_CREATE_VCPU {}", index));
    run_size_ = kvm.vcpu_mmap_size();
    void* addr = ::mmap(nullptr, run_size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
    if (addr == MAP_FAILED)
        throw_errno(fmt::format("mapping kvm_run of vCPU {}", index));
    run_ = static_cast<kvm_run*>(addr);
}

Vcpu::~Vcpu()
{
    if (run_)
        ::munmap(run_, run_size_);
}

void Vcpu::set_cpuid(const std::vector<kvm_cpuid_entry2>& entries)
{
    kvm_abi::CpuidArray cpuid(entries.size());
    cpuid.header().nent = static_cast<uint32_t>(entries.size());
    std::copy(entries.begin(), entries.end(), cpuid.entries().begin());
    vcpu_ioctl(fd_.get(), kvm_abi::set_cpuid2, cpuid.data(), "KVM_SET_CPUID2", index_);
}

void Vcpu::set_msrs(const std::vector<std::pair<uint32_t, uint64_t>>& msrs)
{
    kvm_abi::MsrArray list(msrs.size());
    list.header().nmsrs = static_cast<uint32_t>(msrs.size());
    for (size_t i = 0; i < msrs.size(); ++i) {
        list.entries()[i] = kvm_msr_entry{};
        list.entries()[i].index = msrs[i].first;
        list.entries()[i].data = msrs[i].second;
    }
    // KVM_SET_MSRS returns how many it set; fewer means one was refused.
    const int set = ::ioctl(fd_.get(), kvm_abi::set_msrs, list.data());
    if (set < 0)
        throw_errno(fmt::format("KVM_SET_MSRS on vCPU {}", index_));
    if (static_cast<size_t>(set) != msrs.size())
        throw Error(fmt::format("KVM refused MSR {:#x} on vCPU {}", msrs[static_cast<size_t>(set)].first,
                                index_));
}

kvm_regs Vcpu::regs() const
{
    kvm_regs r{};
    vcpu_ioctl(fd_.get(), KVM_GET_REGS, &r, "KVM_GET_REGS", index_);
    return r;
}

void Vcpu::set_regs(const kvm_regs& r)
{
    vcpu_ioctl(fd_.get(), KVM_SET_REGS, const_cast<kvm_regs*>(&r), "KVM_SET_REGS", index_);
}

kvm_sregs Vcpu::sregs() const
{
    kvm_sregs s{};
    vcpu_ioctl(fd_.get(), KVM_GET_SREGS, &s, "KVM_GET_SREGS", index_);
    return s;
}

void Vcpu::set_sregs(const kvm_sregs& s)
{
    vcpu_ioctl(fd_.get(), KVM_SET_SREGS, const_cast<kvm_sregs*>(&s), "KVM_SET_SREGS", index_);
}

void Vcpu::set_fpu(const kvm_fpu& f)
{
    vcpu_ioctl(fd_.get(), KVM_SET_FPU, const_cast<kvm_fpu*>(&f), "KVM_SET_FPU", index_);
}

void Vcpu::set_local_interrupts()
{
    kvm_lapic_state lapic{};
    vcpu_ioctl(fd_.get(), KVM_GET_LAPIC, &lapic, "KVM_GET_LAPIC", index_);
    auto set_mode = [&](size_t offset, uint32_t mode) {
        uint32_t reg;
        std::memcpy(&reg, lapic.regs + offset, sizeof(reg));
        reg = (reg & ~delivery_mode_mask) | mode;
        std::memcpy(lapic.regs + offset, &reg, sizeof(reg));
    };
    set_mode(apic_lvt_lint0, delivery_extint);
    set_mode(apic_lvt_lint1, delivery_nmi);
    vcpu_ioctl(fd_.get(), KVM_SET_LAPIC, &lapic, "KVM_SET_LAPIC", index_);
}

Exit Vcpu::run()
{
    if (::ioctl(fd_.get(), KVM_RUN, 0) < 0) {
        if (errno == EINTR || errno == EAGAIN)
            return InterruptedExit{};
        throw_errno(fmt::format("KVM_RUN on vCPU {}", index_));
    }
    return decode_exit(*run_, run_size_);
}

void Vcpu::request_exit()
{
    // immediate_exit covers a kick that lands before the thread enters KVM_RUN; the signal
    // (sent by the caller's thread manager) covers one that lands while it is inside.
    std::atomic_ref<uint8_t>(run_->immediate_exit).store(1, std::memory_order_release);
}

void Vcpu::clear_exit_request()
{
    std::atomic_ref<uint8_t>(run_->immediate_exit).store(0, std::memory_order_release);
}

} // namespace agentvm
