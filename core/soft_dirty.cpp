#include "core/soft_dirty.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "common/error.hpp"
#include "core/layout.hpp"

namespace agentvm {
namespace {

constexpr char clear_soft_dirty[] = "4";

} // namespace

SoftDirtyBits::SoftDirtyBits(int pagemap_fd)
    : pagemap_fd_(pagemap_fd), clear_refs_(::open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC))
{
    if (!clear_refs_)
        throw_errno("opening /proc/self/clear_refs (live snapshots track the pages a VM writes with it)");
    void* page = ::mmap(nullptr, layout::page_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED)
        throw_errno("mapping the soft-dirty probe page");
    probe_ = static_cast<volatile uint8_t*>(page);
    probe_[0] = 1;  // present, so that pagemap reports its bits
}

SoftDirtyBits::~SoftDirtyBits()
{
    ::munmap(const_cast<uint8_t*>(probe_), layout::page_size);
}

bool SoftDirtyBits::probe_dirty() const
{
    uint64_t entry = 0;
    const off_t at = static_cast<off_t>(reinterpret_cast<uintptr_t>(probe_) / layout::page_size * sizeof entry);
    const ssize_t n = ::pread(pagemap_fd_, &entry, sizeof entry, at);
    if (n != static_cast<ssize_t>(sizeof entry))
        throw_errno("reading /proc/self/pagemap for the soft-dirty probe", n < 0 ? errno : EIO);
    return entry & pagemap_soft_dirty;
}

bool SoftDirtyBits::clear()
{
    for (;;) {
        const ssize_t n = ::write(clear_refs_.get(), clear_soft_dirty, 1);
        if (n == 1)
            break;
        if (n < 0 && errno == EINTR)
            continue;
        throw_errno("writing /proc/self/clear_refs", n < 0 ? errno : EIO);
    }
    if (probe_dirty())
        return false;
    probe_[0] = static_cast<uint8_t>(probe_[0] + 1);
    return probe_dirty();
}

} // namespace agentvm
