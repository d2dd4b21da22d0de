// The kernel's soft-dirty bits (Documentation/admin-guide/mm/soft-dirty.rst), which let a
// live snapshot copy guest RAM while the VM runs and then, paused, copy again only the pages
// written meanwhile. Writing "4" to /proc/self/clear_refs clears the bit in every page of the
// process and write-protects the page, so the next write to it sets the bit again, whoever
// writes: the guest through KVM (whose mappings the clear invalidates), a device, the kernel
// completing an io_uring read. /proc/self/pagemap shows the bit (GuestMemory::private_pages).
#pragma once

#include <cstdint>

#include "common/fd.hpp"

namespace agentvm {

// A /proc/self/pagemap entry's soft-dirty bit.
inline constexpr uint64_t pagemap_soft_dirty = uint64_t{1} << 55;

class SoftDirtyBits {
public:
    // Opens /proc/self/clear_refs, which a jailed process cannot reach by name. pagemap_fd is
    // /proc/self/pagemap, opened likewise, and must outlive this. Throws Error.
    explicit SoftDirtyBits(int pagemap_fd);
    ~SoftDirtyBits();
    SoftDirtyBits(const SoftDirtyBits&) = delete;
    SoftDirtyBits& operator=(const SoftDirtyBits&) = delete;

    // Clears every page's bit. False when this kernel keeps no soft-dirty bits (built without
    // CONFIG_MEM_SOFT_DIRTY), which would make every page look unwritten: checked each time on
    // a page of its own, which must read clean after the clear and dirty after a write.
    // Throws Error when clear_refs or pagemap cannot be used.
    bool clear();

private:
    bool probe_dirty() const;

    int pagemap_fd_;
    Fd clear_refs_;
    volatile uint8_t* probe_ = nullptr;  // a page of its own: written only to test the bit
};

} // namespace agentvm
