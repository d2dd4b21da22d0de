// Warm pages: the guest pages a snapshot's guest wrote while it ran the bake's warm-up calls,
// recorded with KVM's dirty log, and made private copies of up front by every restore.
//
// Why: restored guest RAM is the snapshot file mapped MAP_PRIVATE. A guest page that is read
// and then written costs two nested page faults (KVM maps the file page read-only, then the
// write faults again and the host copies it), and each nested fault is an exit. Calls after a
// restore write largely the pages the warm-up calls wrote: the guest frees them last before
// the snapshot and so allocates them first after it. Copying those pages before the guest runs
// (MADV_POPULATE_WRITE) leaves one fault per page, with no copy in it. Measured in the test
// host: a restored `echo hi` took ~1,460 nested faults instead of ~1,900, and its median fell
// from ~445 to ~320 ms; the pages cost host memory they would cost anyway once the guest runs
// a call. This is the REAP idea (ASPLOS '21) for writes; prefetching the pages the guest only
// reads did not help there, since the nested fault remains.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/state_codec.hpp"
#include "core/guest_memory.hpp"

namespace agentvm {

// Pages [first, first + count) of guest RAM, numbered as in the memory file (offset / 4 KiB).
using PageRun = IndexRun;

// KVM's dirty log on every memslot of a VM: which pages the vCPUs write from start() on.
// Writes the VMM makes itself (device DMA) are not counted: they copy on write as they happen.
class WriteLog {
public:
    // Turns on KVM_MEM_LOG_DIRTY_PAGES for the slots map_memory() created, numbered from 0 in
    // mem.regions() order. Throws Error.
    static void start(int vm_fd, const GuestMemory& mem);
    // Turns it off and returns the pages written since start(), in order. Throws Error.
    static std::vector<PageRun> stop(int vm_fd, const GuestMemory& mem);
};

// The state's memory.warm_writes (runs_from_json): runs inside ram_pages. Throws Error.
std::vector<PageRun> page_runs_from_json(const nlohmann::json& j, uint64_t ram_pages);

// Makes the runs' pages of a snapshot-backed `mem` private copies now. Only an optimisation:
// a kernel without MADV_POPULATE_WRITE (before 5.14) leaves them to the guest's faults.
void copy_warm_pages(const GuestMemory& mem, const std::vector<PageRun>& runs);

} // namespace agentvm
