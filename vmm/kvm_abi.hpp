// KVM ioctls whose argument ends in a flexible array, spelled out for C++.
//
// Debian 12's 6.1 UAPI headers declare those arrays with __DECLARE_FLEX_ARRAY, which in C++
// wraps them in a union with an empty struct: sizeof(kvm_cpuid2) becomes 12 instead of 8, so
// the _IOWR()-derived request numbers no longer match the kernel's and KVM answers EINVAL.
// The same goes for kvm_msrs, kvm_msr_list and kvm_xsave (4100 bytes instead of 4096).
// Here the headers are declared with their C layout and the request numbers derived from
// them, checked against the values the kernel defines.
#pragma once

#include <linux/kvm.h>
#include <sys/ioctl.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

namespace agentvm::kvm_abi {

struct CpuidHeader {
    uint32_t nent;
    uint32_t padding;
};
struct MsrsHeader {
    uint32_t nmsrs;
    uint32_t pad;
};
struct MsrListHeader {
    uint32_t nmsrs;
};
// struct kvm_xsave without its flexible tail: the legacy 4 KiB area. Larger areas
// (KVM_CAP_XSAVE2) are passed as longer buffers with the same request numbers.
struct XsaveRegion {
    uint32_t region[1024];
};

inline constexpr unsigned long get_supported_cpuid = _IOWR(KVMIO, 0x05, CpuidHeader);
inline constexpr unsigned long set_cpuid2 = _IOW(KVMIO, 0x90, CpuidHeader);
inline constexpr unsigned long get_msrs = _IOWR(KVMIO, 0x88, MsrsHeader);
inline constexpr unsigned long set_msrs = _IOW(KVMIO, 0x89, MsrsHeader);
static_assert(get_supported_cpuid == 0xc008ae05 && set_cpuid2 == 0x4008ae90);
static_assert(get_msrs == 0xc008ae88 && set_msrs == 0x4008ae89);
inline constexpr unsigned long get_cpuid2 = _IOWR(KVMIO, 0x91, CpuidHeader);
inline constexpr unsigned long get_msr_index_list = _IOWR(KVMIO, 0x02, MsrListHeader);
static_assert(get_cpuid2 == 0xc008ae91 && get_msr_index_list == 0xc004ae02);
inline constexpr unsigned long get_xsave = _IOR(KVMIO, 0xa4, XsaveRegion);
inline constexpr unsigned long set_xsave = _IOW(KVMIO, 0xa5, XsaveRegion);
inline constexpr unsigned long get_xsave2 = _IOR(KVMIO, 0xcf, XsaveRegion);
static_assert(get_xsave == 0x9000aea4 && set_xsave == 0x5000aea5 && get_xsave2 == 0x9000aecf);

// A header followed by `count` entries, laid out as the kernel expects.
template <typename Header, typename Entry>
class FlexArray {
public:
    explicit FlexArray(size_t count)
        : count_(count), storage_(std::make_unique<uint64_t[]>((bytes() + 7) / 8))
    {
    }
    void* data() { return storage_.get(); }
    Header& header() { return *reinterpret_cast<Header*>(storage_.get()); }
    std::span<Entry> entries()
    {
        return {reinterpret_cast<Entry*>(reinterpret_cast<uint8_t*>(storage_.get()) + sizeof(Header)),
                count_};
    }

private:
    size_t bytes() const { return sizeof(Header) + count_ * sizeof(Entry); }
    size_t count_;
    std::unique_ptr<uint64_t[]> storage_;
};

using CpuidArray = FlexArray<CpuidHeader, kvm_cpuid_entry2>;
using MsrArray = FlexArray<MsrsHeader, kvm_msr_entry>;
using MsrIndexArray = FlexArray<MsrListHeader, uint32_t>;

} // namespace agentvm::kvm_abi
