// How a live snapshot of a restored VM keeps the pause short: what the VM has written so far is
// copied into the snapshot's files while it runs, with its later writes tracked (guest RAM by
// the kernel's soft-dirty bits, core/soft_dirty.hpp; the disk by CowDisk::track_writes), and
// only what was written meanwhile is copied again once the vCPUs are parked.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/state_codec.hpp"

namespace agentvm {

// Byte ranges [offset, offset+length) of a disk.
using ByteRanges = std::vector<std::pair<uint64_t, uint64_t>>;

struct LiveCopy {
    std::vector<IndexRun> pages;   // runs of pages in the memory file, merged as a restore maps them
    bool pages_tracked = false;    // the soft-dirty bits were cleared before `pages` were copied
    ByteRanges disk;               // the disk overlay's byte ranges in the disk file
    uint64_t running_bytes = 0;    // copied while the VM ran
    uint64_t paused_bytes = 0;     // copied while it was paused
};

// The pause's share of the memory copy: of `now` (the pages the VM owns now, merged), the ones
// to write again, and the runs the copy made earlier that `now` no longer covers, whose data
// must go (punched out). A page is written again unless the earlier copy has it and, tracked,
// its soft-dirty bit says it was not written since. All lists in page order.
struct PausedPages {
    std::vector<IndexRun> write;
    std::vector<IndexRun> punch;
};
PausedPages paused_pages(uint64_t ram_pages, const std::vector<IndexRun>& now, const std::vector<IndexRun>& copied,
                         bool tracked, const std::vector<IndexRun>& soft_dirty);

} // namespace agentvm
