// The /dev/kvm system handle: opens it with errors a user can act on, checks the API and
// the capabilities agentvm relies on, and answers system-level queries.
#pragma once

#include <linux/kvm.h>

#include <cstdint>
#include <vector>

#include "common/fd.hpp"

namespace agentvm {

// An ioctl on a KVM fd (system, VM or vCPU) that must succeed: throws Error naming `what`.
void kvm_ioctl(int fd, unsigned long request, const void* arg, const char* what);

class Kvm {
public:
    // Throws Error naming the problem: missing /dev/kvm, no permission, wrong API, missing cap.
    Kvm();

    int fd() const { return fd_.get(); }
    int check_extension(long cap) const;
    size_t vcpu_mmap_size() const { return vcpu_mmap_size_; }
    // The largest vCPU count KVM accepts for one VM.
    uint32_t max_vcpus() const;
    std::vector<kvm_cpuid_entry2> supported_cpuid() const;
    Fd create_vm() const;

private:
    Fd fd_;
    size_t vcpu_mmap_size_ = 0;
};

} // namespace agentvm
