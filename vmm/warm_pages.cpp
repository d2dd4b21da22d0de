#include "vmm/warm_pages.hpp"

#include <linux/kvm.h>
#include <sys/ioctl.h>

#include <chrono>

#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "core/layout.hpp"

namespace agentvm {

namespace {

using layout::page_size;

void set_slot_flags(int vm_fd, uint32_t slot, const MemoryRegion& r, uint32_t flags)
{
    kvm_userspace_memory_region region{};
    region.slot = slot;
    region.flags = flags;
    region.guest_phys_addr = r.gpa;
    region.memory_size = r.size;
    region.userspace_addr = reinterpret_cast<uint64_t>(r.host);
    if (::ioctl(vm_fd, KVM_SET_USER_MEMORY_REGION, &region) < 0)
        throw_errno("KVM_SET_USER_MEMORY_REGION (dirty log)");
}

} // namespace

void WriteLog::start(int vm_fd, const GuestMemory& mem)
{
    uint32_t slot = 0;
    for (const MemoryRegion& r : mem.regions())
        set_slot_flags(vm_fd, slot++, r, KVM_MEM_LOG_DIRTY_PAGES);
}

std::vector<PageRun> WriteLog::stop(int vm_fd, const GuestMemory& mem)
{
    std::vector<PageRun> runs;
    uint32_t slot = 0;
    for (const MemoryRegion& r : mem.regions()) {
        const uint64_t pages = r.size / page_size;
        std::vector<uint64_t> bitmap((pages + 63) / 64);
        kvm_dirty_log log{};
        log.slot = slot;
        log.dirty_bitmap = bitmap.data();
        if (::ioctl(vm_fd, KVM_GET_DIRTY_LOG, &log) < 0)
            throw_errno("KVM_GET_DIRTY_LOG");
        set_slot_flags(vm_fd, slot++, r, 0);
        const uint64_t base = r.fd_offset / page_size;
        for (uint64_t page = 0; page < pages; ++page) {
            if (!(bitmap[page / 64] >> (page % 64) & 1))
                continue;
            if (!runs.empty() && runs.back().first + runs.back().count == base + page)
                ++runs.back().count;
            else
                runs.push_back({base + page, 1});
        }
    }
    return runs;
}

std::vector<PageRun> page_runs_from_json(const nlohmann::json& j, uint64_t ram_pages)
{
    return state_codec::runs_from_json(j, "memory.warm_writes", ram_pages, "page", "guest RAM's");
}

void copy_warm_pages(const GuestMemory& mem, const std::vector<PageRun>& runs)
{
    const auto start = std::chrono::steady_clock::now();
    uint64_t pages = 0;
    for (const PageRun& run : runs) {
        if (!mem.populate_private(run.first, run.count)) {
            spdlog::debug("this kernel cannot populate pages ahead (MADV_POPULATE_WRITE): the guest faults them in");
            return;
        }
        pages += run.count;
    }
    spdlog::debug("{} warm guest pages ({} runs) copied ahead of the guest's writes in {:.1f} ms", pages, runs.size(),
                  std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
}

} // namespace agentvm
