#include "vmm/kvm.hpp"

#include <fcntl.h>
#include <sys/ioctl.h>

#include <cerrno>

#include <fmt/format.h>

#include "common/error.hpp"
#include "vmm/kvm_abi.hpp"

namespace agentvm {

void kvm_ioctl(int fd, unsigned long request, const void* arg, const char* what)
{
    if (::ioctl(fd, request, arg) < 0)
        throw_errno(what);
}

namespace {

// What the VMM cannot work without; each is checked up front so a missing one is one clear
// line, not an obscure ioctl failure halfway through building the VM.
struct RequiredCap {
    long cap;
    const char* name;
};
constexpr RequiredCap required_caps[] = {
    {KVM_CAP_IRQCHIP, "KVM_CAP_IRQCHIP"},
    {KVM_CAP_PIT2, "KVM_CAP_PIT2"},
    {KVM_CAP_IRQFD, "KVM_CAP_IRQFD"},
    {KVM_CAP_IOEVENTFD, "KVM_CAP_IOEVENTFD"},
    {KVM_CAP_USER_MEMORY, "KVM_CAP_USER_MEMORY"},
    {KVM_CAP_EXT_CPUID, "KVM_CAP_EXT_CPUID"},
    {KVM_CAP_SET_TSS_ADDR, "KVM_CAP_SET_TSS_ADDR"},
    {KVM_CAP_IMMEDIATE_EXIT, "KVM_CAP_IMMEDIATE_EXIT"},
};

} // namespace

Kvm::Kvm()
{
    fd_ = Fd(::open("/dev/kvm", O_RDWR | O_CLOEXEC));
    if (!fd_) {
        const int err = errno;
        if (err == ENOENT)
            throw Error("/dev/kvm does not exist: this host has no KVM (load kvm_intel or kvm_amd, "
                        "or use a machine with virtualization enabled)");
        if (err == EACCES || err == EPERM)
            throw Error("/dev/kvm is not accessible: run as root or add this user to the kvm group");
        throw_errno("opening /dev/kvm", err);
    }
    const int version = ::ioctl(fd_.get(), KVM_GET_API_VERSION, 0);
    if (version != KVM_API_VERSION)
        throw Error(fmt::format("/dev/kvm speaks API version {}, agentvm needs {}", version,
                                KVM_API_VERSION));
    for (const auto& req : required_caps) {
        if (check_extension(req.cap) <= 0)
            throw Error(fmt::format("/dev/kvm lacks {}, which agentvm needs", req.name));
    }
    const int size = ::ioctl(fd_.get(), KVM_GET_VCPU_MMAP_SIZE, 0);
    if (size <= 0)
        throw_errno("KVM_GET_VCPU_MMAP_SIZE");
    vcpu_mmap_size_ = static_cast<size_t>(size);
}

int Kvm::check_extension(long cap) const
{
    return ::ioctl(fd_.get(), KVM_CHECK_EXTENSION, cap);
}

uint32_t Kvm::max_vcpus() const
{
    int n = check_extension(KVM_CAP_MAX_VCPUS);
    if (n <= 0)
        n = check_extension(KVM_CAP_NR_VCPUS);
    // The API says 4 when neither capability answers.
    return n > 0 ? static_cast<uint32_t>(n) : 4u;
}

std::vector<kvm_cpuid_entry2> Kvm::supported_cpuid() const
{
    // KVM_GET_SUPPORTED_CPUID fails with E2BIG until the buffer is large enough. Each call
    // costs ~0.7 ms where CPUID traps, so the first try fits any CPU we know (~80-120 leaves).
    for (uint32_t capacity = 256; capacity <= 4096; capacity *= 2) {
        kvm_abi::CpuidArray cpuid(capacity);
        cpuid.header().nent = capacity;
        if (::ioctl(fd_.get(), kvm_abi::get_supported_cpuid, cpuid.data()) == 0) {
            auto entries = cpuid.entries().first(cpuid.header().nent);
            return {entries.begin(), entries.end()};
        }
        if (errno != E2BIG)
            throw_errno("KVM_GET_SUPPORTED_CPUID");
    }
    throw Error("KVM_GET_SUPPORTED_CPUID: more than 4096 entries");
}

Fd Kvm::create_vm() const
{
    // KVM_CREATE_VM can fail transiently with EINTR while the kernel sets up the VM.
    for (int attempt = 0; attempt < 8; ++attempt) {
        const int vm = ::ioctl(fd_.get(), KVM_CREATE_VM, 0);
        if (vm >= 0)
            return Fd(vm);
        if (errno != EINTR)
            throw_errno("KVM_CREATE_VM");
    }
    throw_errno("KVM_CREATE_VM");
}

} // namespace agentvm
