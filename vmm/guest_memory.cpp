#include "vmm/guest_memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <fmt/format.h>
#include <utility>

#include "vmm/layout.hpp"

namespace agentvm {

GuestMemory::GuestMemory(uint64_t ram_bytes) : ram_size_(ram_bytes)
{
    if (ram_bytes == 0 || ram_bytes % 4096 != 0)
        throw Error("guest memory size must be a non-zero multiple of 4 KiB");

    memfd_ = Fd(::memfd_create("agentvm-guest-ram", MFD_CLOEXEC));
    if (!memfd_)
        throw_errno("memfd_create for guest RAM");
    if (::ftruncate(memfd_.get(), static_cast<off_t>(ram_bytes)) != 0)
        throw_errno("sizing guest RAM memfd");
    // MAP_NORESERVE: guest RAM is touched lazily; a 4 GiB guest that uses 200 MiB costs 200 MiB.
    void* addr = ::mmap(nullptr, ram_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE,
                        memfd_.get(), 0);
    if (addr == MAP_FAILED)
        throw_errno("mapping guest RAM");
    mapping_ = static_cast<uint8_t*>(addr);

    const uint64_t low = std::min(ram_bytes, layout::mmio_gap_start);
    regions_.push_back({0, low, 0, mapping_});
    if (ram_bytes > low)
        regions_.push_back({layout::mmio_gap_end, ram_bytes - low, low, mapping_ + low});
}

GuestMemory::GuestMemory(GuestMemory&& other) noexcept
    : memfd_(std::move(other.memfd_)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      ram_size_(std::exchange(other.ram_size_, 0)),
      regions_(std::move(other.regions_))
{
}

GuestMemory::~GuestMemory()
{
    if (mapping_)
        ::munmap(mapping_, ram_size_);
}

const MemoryRegion* GuestMemory::find(uint64_t gpa, uint64_t len) const noexcept
{
    for (const auto& r : regions_) {
        // Written so that no sum can overflow: gpa >= r.gpa, then compare remaining room.
        if (gpa < r.gpa)
            continue;
        const uint64_t offset = gpa - r.gpa;
        if (offset > r.size || len > r.size - offset)
            continue;
        return &r;
    }
    return nullptr;
}

bool GuestMemory::contains(uint64_t gpa, uint64_t len) const noexcept
{
    return find(gpa, len) != nullptr;
}

std::span<uint8_t> GuestMemory::span(uint64_t gpa, uint64_t len) const
{
    const MemoryRegion* r = find(gpa, len);
    if (!r)
        throw GuestError(fmt::format("guest address range [{:#x}, +{:#x}) is outside RAM", gpa, len));
    return {r->host + (gpa - r->gpa), static_cast<size_t>(len)};
}

void GuestMemory::read(uint64_t gpa, std::span<uint8_t> out) const
{
    auto src = span(gpa, out.size());
    std::copy(src.begin(), src.end(), out.begin());
}

void GuestMemory::write(uint64_t gpa, std::span<const uint8_t> in) const
{
    auto dst = span(gpa, in.size());
    std::copy(in.begin(), in.end(), dst.begin());
}

} // namespace agentvm
