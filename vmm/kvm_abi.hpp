// KVM ioctls whose argument ends in a flexible array, spelled out for C++.
//
// Debian 12's 6.1 UAPI headers declare those arrays with __DECLARE_FLEX_ARRAY, which in C++
// wraps them in a union with an empty struct: sizeof(kvm_cpuid2) becomes 12 instead of 8, so
// the _IOWR()-derived request numbers no longer match the kernel's and KVM answers EINVAL.
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

inline constexpr unsigned long get_supported_cpuid = _IOWR(KVMIO, 0x05, CpuidHeader);
inline constexpr unsigned long set_cpuid2 = _IOW(KVMIO, 0x90, CpuidHeader);
inline constexpr unsigned long get_msrs = _IOWR(KVMIO, 0x88, MsrsHeader);
inline constexpr unsigned long set_msrs = _IOW(KVMIO, 0x89, MsrsHeader);
static_assert(get_supported_cpuid == 0xc008ae05 && set_cpuid2 == 0x4008ae90);
static_assert(get_msrs == 0xc008ae88 && set_msrs == 0x4008ae89);

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

} // namespace agentvm::kvm_abi
