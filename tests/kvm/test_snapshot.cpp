// kvm tier: a tiny guest is stopped at an exit, its KVM state and memory are saved through
// CBOR, and fresh VMs restored from that snapshot go on exactly where it stopped.
#include <doctest/doctest.h>

#include <sys/ioctl.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/kvm/tiny_guest.hpp"
#include "vmm/boot.hpp"
#include "vmm/cpuid.hpp"
#include "common/error.hpp"
#include "vmm/exit.hpp"
#include "vmm/kvm.hpp"
#include "vmm/kvm_abi.hpp"
#include "vmm/kvm_state_json.hpp"
#include "core/layout.hpp"
#include "vmm/vcpu.hpp"
#include "vmm/vcpu_state.hpp"
#include "vmm/vm_kvm_state.hpp"
#include "vmm/warm_pages.hpp"

using namespace agentvm;
using namespace agentvm::test;
using nlohmann::json;

namespace {

constexpr uint64_t ram_bytes = 64 * layout::mib;
// MSRs that are clocks, running on their own between save and restore. Besides the TSC, KVM
// lists Hyper-V's vCPU run time and reference counter (hyperv-tlfs.h, not in the UAPI) where
// it is built with Hyper-V emulation, as Debian's 6.1 kernel is (the test host's kvm_amd).
constexpr uint32_t msr_ia32_tsc = 0x10;
constexpr uint32_t msr_hv_vp_runtime = 0x40000010;
constexpr uint32_t msr_hv_time_ref_count = 0x40000020;
constexpr uint32_t clock_msrs[] = {msr_ia32_tsc, msr_hv_vp_runtime, msr_hv_time_ref_count};

void check_ioctl(int fd, unsigned long request, const void* arg, const char* name)
{
    if (::ioctl(fd, request, arg) < 0)
        throw_errno(name);
}

// A one-vCPU VM built with plain ioctls, as Vm builds it (irqchip, PIT, RAM), so that the
// test holds the VM and vCPU fds the snapshot functions take; Vm and Vcpu keep theirs.
class RawVm {
public:
    explicit RawVm(const Kvm& kvm) : vm_(kvm.create_vm()), mem_(ram_bytes)
    {
        check_ioctl(vm_.get(), KVM_SET_TSS_ADDR, reinterpret_cast<const void*>(0xfffbd000ul),
                    "KVM_SET_TSS_ADDR");
        check_ioctl(vm_.get(), KVM_CREATE_IRQCHIP, nullptr, "KVM_CREATE_IRQCHIP");
        kvm_pit_config pit{};
        pit.flags = KVM_PIT_SPEAKER_DUMMY;
        check_ioctl(vm_.get(), KVM_CREATE_PIT2, &pit, "KVM_CREATE_PIT2");
        uint32_t slot = 0;
        for (const auto& r : mem_.regions()) {
            kvm_userspace_memory_region region{};
            region.slot = slot++;
            region.guest_phys_addr = r.gpa;
            region.memory_size = r.size;
            region.userspace_addr = reinterpret_cast<uint64_t>(r.host);
            check_ioctl(vm_.get(), KVM_SET_USER_MEMORY_REGION, &region, "KVM_SET_USER_MEMORY_REGION");
        }
        vcpu_ = Fd(::ioctl(vm_.get(), KVM_CREATE_VCPU, 0ul));
        if (!vcpu_)
            throw_errno("KVM_CREATE_VCPU");
        run_size_ = kvm.vcpu_mmap_size();
        void* run = ::mmap(nullptr, run_size_, PROT_READ | PROT_WRITE, MAP_SHARED, vcpu_.get(), 0);
        if (run == MAP_FAILED)
            throw_errno("mapping kvm_run");
        run_ = static_cast<kvm_run*>(run);
    }
    ~RawVm() { ::munmap(run_, run_size_); }
    RawVm(const RawVm&) = delete;
    RawVm& operator=(const RawVm&) = delete;

    int vm_fd() const { return vm_.get(); }
    int vcpu_fd() const { return vcpu_.get(); }
    const GuestMemory& memory() const { return mem_; }

    // The guest's port writes go to `ports`; returns what the exit means.
    ExitAction step(ResultPorts& ports)
    {
        Bus pio;
        pio.insert(0x500, 8, ports);
        return handle_exit(run(), pio, Bus{}).action;
    }

    // KVM completes the instruction of an I/O exit only on the next KVM_RUN: re-enter with
    // immediate_exit set, which finishes it and returns EINTR before any guest code runs.
    void complete_exit()
    {
        run_->immediate_exit = 1;
        const Exit exit = run();
        run_->immediate_exit = 0;
        REQUIRE(std::holds_alternative<InterruptedExit>(exit));
    }

private:
    Exit run()
    {
        if (::ioctl(vcpu_.get(), KVM_RUN, 0) < 0) {
            if (errno == EINTR)
                return InterruptedExit{};
            throw_errno("KVM_RUN");
        }
        return decode_exit(*run_, run_size_);
    }

    Fd vm_;
    GuestMemory mem_;
    Fd vcpu_;
    kvm_run* run_ = nullptr;
    size_t run_size_ = 0;
};

// Loads the guest and sets the vCPU up as Vm::create_vcpus() does for the boot vCPU.
void boot(const Kvm& kvm, RawVm& vm, const char* guest)
{
    const LoadedKernel kernel = load_kernel(vm.memory(), read_kernel_file(guest_path(guest)));
    write_boot_data(vm.memory(), kernel, "");

    const auto cpuid_entries = adjust_cpuid(kvm.supported_cpuid(),
        {0, 1, kvm.check_extension(KVM_CAP_TSC_DEADLINE_TIMER) > 0});
    kvm_abi::CpuidArray cpuid(cpuid_entries.size());
    cpuid.header().nent = static_cast<uint32_t>(cpuid_entries.size());
    std::copy(cpuid_entries.begin(), cpuid_entries.end(), cpuid.entries().begin());
    check_ioctl(vm.vcpu_fd(), kvm_abi::set_cpuid2, cpuid.data(), "KVM_SET_CPUID2");

    const auto msr_values = boot_msrs();
    kvm_abi::MsrArray msrs(msr_values.size());
    msrs.header().nmsrs = static_cast<uint32_t>(msr_values.size());
    for (size_t i = 0; i < msr_values.size(); ++i) {
        msrs.entries()[i].index = msr_values[i].first;
        msrs.entries()[i].data = msr_values[i].second;
    }
    REQUIRE(::ioctl(vm.vcpu_fd(), kvm_abi::set_msrs, msrs.data()) == static_cast<int>(msr_values.size()));

    const kvm_regs regs = boot_regs(kernel);
    check_ioctl(vm.vcpu_fd(), KVM_SET_REGS, &regs, "KVM_SET_REGS");
    kvm_sregs sregs{};
    check_ioctl(vm.vcpu_fd(), KVM_GET_SREGS, &sregs, "KVM_GET_SREGS");
    set_boot_sregs(sregs);
    check_ioctl(vm.vcpu_fd(), KVM_SET_SREGS, &sregs, "KVM_SET_SREGS");
    const kvm_fpu fpu = boot_fpu();
    check_ioctl(vm.vcpu_fd(), KVM_SET_FPU, &fpu, "KVM_SET_FPU");
}

struct Snapshot {
    std::vector<uint8_t> state;  // CBOR, as a snapshot file holds it
    std::vector<uint8_t> ram;
};

// Runs trace_counter until it has reported `steps` counts, then saves it.
Snapshot run_and_save(const Kvm& kvm, uint32_t steps)
{
    RawVm vm(kvm);
    boot(kvm, vm, "trace_counter.elf");
    ResultPorts ports;
    while (ports.trace().size() < steps)
        REQUIRE(vm.step(ports) == ExitAction::resume);
    vm.complete_exit();

    std::vector<uint32_t> expected(steps);
    std::iota(expected.begin(), expected.end(), 1u);
    REQUIRE(ports.trace() == expected);

    const json state = {
        {"vcpu", vcpu_state_to_json(save_vcpu_state(kvm, vm.vcpu_fd()))},
        {"vm", vm_kvm_state_to_json(save_vm_kvm_state(vm.vm_fd()))},
    };
    std::vector<uint8_t> ram(vm.memory().ram_size());
    vm.memory().read(0, ram);
    return {json::to_cbor(state), std::move(ram)};
}

template <typename T>
bool same_bytes(const T& a, const T& b)
{
    return std::memcmp(&a, &b, sizeof(T)) == 0;
}

bool is_clock(const Msr& m)
{
    return std::ranges::find(clock_msrs, m.index) != std::end(clock_msrs);
}

std::vector<Msr> without_clocks(std::vector<Msr> msrs)
{
    std::erase_if(msrs, is_clock);
    return msrs;
}

// Each clock MSR read back after the restore is at or past the value saved: it went on from
// there, never back.
bool clocks_went_on(const std::vector<Msr>& restored, const std::vector<Msr>& saved)
{
    for (const Msr& s : saved) {
        if (!is_clock(s))
            continue;
        const auto r = std::ranges::find(restored, s.index, &Msr::index);
        if (r == restored.end() || r->value < s.value)
            return false;
    }
    return true;
}

} // namespace

TEST_CASE("a guest saved at an exit and restored into fresh VMs continues where it stopped")
{
    Kvm kvm;
    const Snapshot snapshot = run_and_save(kvm, 300);
    const json state = json::from_cbor(snapshot.state);
    const VcpuState vcpu = vcpu_state_from_json(state.at("vcpu"));
    const VmKvmState vm_state = vm_kvm_state_from_json(state.at("vm"));
    CHECK_FALSE(vcpu.msrs.empty());

    // One snapshot, restored twice: each copy runs the rest of the count on its own.
    for (int copy = 0; copy < 2; ++copy) {
        CAPTURE(copy);
        RawVm vm(kvm);
        vm.memory().write(0, snapshot.ram);
        restore_vcpu_state(kvm, vm.vcpu_fd(), vcpu);
        restore_vm_kvm_state(vm.vm_fd(), vm_state);

        // KVM holds what was saved: registers and the rest as they were, only the clocks have
        // moved on.
        const VcpuState restored = save_vcpu_state(kvm, vm.vcpu_fd());
        CHECK(same_bytes(restored.regs, vcpu.regs));
        CHECK(same_bytes(restored.sregs, vcpu.sregs));
        CHECK(restored.xsave == vcpu.xsave);
        CHECK(same_bytes(restored.xcrs, vcpu.xcrs));
        CHECK(same_bytes(restored.debugregs, vcpu.debugregs));
        CHECK(same_bytes(restored.lapic, vcpu.lapic));
        CHECK(same_bytes(restored.events, vcpu.events));
        CHECK(restored.mp_state.mp_state == vcpu.mp_state.mp_state);
        CHECK(vcpu_state_to_json(restored)["cpuid"] == vcpu_state_to_json(vcpu)["cpuid"]);
        CHECK(without_clocks(restored.msrs) == without_clocks(vcpu.msrs));
        CHECK(clocks_went_on(restored.msrs, vcpu.msrs));
        const VmKvmState restored_vm = save_vm_kvm_state(vm.vm_fd());
        CHECK(same_bytes(restored_vm.pic_master, vm_state.pic_master));
        CHECK(same_bytes(restored_vm.pic_slave, vm_state.pic_slave));
        CHECK(same_bytes(restored_vm.ioapic, vm_state.ioapic));
        CHECK(restored_vm.clock.clock >= vm_state.clock.clock);

        ResultPorts ports;
        ExitAction action;
        while ((action = vm.step(ports)) == ExitAction::resume) {
        }
        CHECK(action == ExitAction::power_off);
        std::vector<uint32_t> rest(700);
        std::iota(rest.begin(), rest.end(), 301u);
        CHECK(ports.trace() == rest);
        REQUIRE(ports.result().has_value());
        CHECK(*ports.result() == 1000u * 1001u / 2u);
    }
}

TEST_CASE("a state this KVM cannot load is an Error naming the ioctl")
{
    Kvm kvm;
    const Snapshot snapshot = run_and_save(kvm, 1);
    const VcpuState vcpu = vcpu_state_from_json(json::from_cbor(snapshot.state).at("vcpu"));

    SUBCASE("an MSR that does not exist")
    {
        RawVm vm(kvm);
        VcpuState bad = vcpu;
        bad.msrs.push_back({0x4b564dff, 1});
        CHECK_THROWS_WITH_AS(restore_vcpu_state(kvm, vm.vcpu_fd(), bad),
                             doctest::Contains("KVM_SET_MSRS: KVM refused MSR 0x4b564dff"), Error);
    }
    SUBCASE("an XCR0 without x87 state")
    {
        RawVm vm(kvm);
        VcpuState bad = vcpu;
        bad.xcrs.xcrs[0].value = 0;
        CHECK_THROWS_WITH_AS(restore_vcpu_state(kvm, vm.vcpu_fd(), bad),
                             doctest::Contains("KVM_SET_XCRS"), Error);
    }
    SUBCASE("an XSAVE area larger than this host's")
    {
        RawVm vm(kvm);
        VcpuState bad = vcpu;
        bad.xsave.resize(max_xsave_bytes);
        CHECK_THROWS_WITH_AS(restore_vcpu_state(kvm, vm.vcpu_fd(), bad),
                             doctest::Contains("KVM_SET_XSAVE"), Error);
    }
}

TEST_CASE("the write log holds the pages the vCPU wrote, not the VMM's own writes")
{
    Kvm kvm;
    RawVm vm(kvm);
    boot(kvm, vm, "trace_counter.elf");
    ResultPorts ports;
    while (ports.trace().size() < 10)
        REQUIRE(vm.step(ports) == ExitAction::resume);

    std::vector<uint8_t> before(vm.memory().ram_size());
    vm.memory().read(0, before);
    WriteLog::start(vm.vm_fd(), vm.memory());
    const uint64_t host_page = 0x200;  // 2 MiB: nothing of the guest's is there
    vm.memory().write_obj<uint64_t>(host_page * 4096, 42);
    while (ports.trace().size() < 20)
        REQUIRE(vm.step(ports) == ExitAction::resume);
    const std::vector<PageRun> runs = WriteLog::stop(vm.vm_fd(), vm.memory());

    std::vector<uint8_t> after(vm.memory().ram_size());
    vm.memory().read(0, after);
    std::vector<uint64_t> logged;
    for (const PageRun& run : runs)
        for (uint64_t page = run.first; page < run.first + run.count; ++page)
            logged.push_back(page);
    CHECK(std::find(logged.begin(), logged.end(), host_page) == logged.end());
    // Every page whose content the guest changed (its running sum, in .bss) is logged; the
    // log may hold a few more (the CPU's accessed and dirty bits in its page tables).
    size_t changed = 0;
    for (uint64_t page = 0; page < before.size() / 4096; ++page) {
        if (page == host_page || std::memcmp(&before[page * 4096], &after[page * 4096], 4096) == 0)
            continue;
        ++changed;
        CAPTURE(page);
        CHECK(std::find(logged.begin(), logged.end(), page) != logged.end());
    }
    CHECK(changed >= 1);
    CHECK(logged.size() < 16);
    // Logging is off again, and the guest runs on.
    while (ports.trace().size() < 30)
        REQUIRE(vm.step(ports) == ExitAction::resume);
}
