// Guest RAM: the only holder of host pointers into the guest.
//
// RAM is one memfd mapped MAP_SHARED (or, restored from a snapshot, the snapshot's memory
// file mapped MAP_PRIVATE) and split into regions around the 32-bit MMIO gap. Every access is bounds- and overflow-checked
// against a single region; an access that leaves RAM throws GuestError, because the address
// nearly always comes from the guest.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "common/error.hpp"
#include "common/fd.hpp"
#include "core/state_codec.hpp"

namespace agentvm {

// A live snapshot's pages over the memory file below it (vmm/snapshot.hpp): a file of RAM's
// size whose runs of pages (numbered as in the file) replace the ones beneath.
struct MemoryLayer {
    Fd file;
    std::vector<IndexRun> pages;
};

struct MemoryRegion {
    uint64_t gpa;
    uint64_t size;
    uint64_t fd_offset;  // offset of this region in the memfd
    uint8_t* host;
};

class GuestMemory {
public:
    // ram_bytes of RAM laid out as layout.hpp says: [0, min(ram, gap)) then [4 GiB, ...).
    explicit GuestMemory(uint64_t ram_bytes);
    // RAM from a snapshot's memory file, mapped MAP_PRIVATE: pages load on first touch and
    // stay shared through the page cache with every VM restored from the same file until the
    // guest writes them. Each layer's runs are mapped over it the same way, lowest first.
    // Throws Error unless every file is exactly ram_bytes long and the runs lie inside RAM.
    static GuestMemory from_snapshot(Fd file, uint64_t ram_bytes, const std::string& name,
                                     std::vector<MemoryLayer> layers = {});
    GuestMemory(GuestMemory&&) noexcept;
    GuestMemory& operator=(GuestMemory&&) = delete;
    GuestMemory(const GuestMemory&) = delete;
    GuestMemory& operator=(const GuestMemory&) = delete;
    ~GuestMemory();

    uint64_t ram_size() const { return ram_size_; }
    const std::vector<MemoryRegion>& regions() const { return regions_; }
    int fd() const { return memfd_.get(); }

    // Writes all of RAM into out_fd (an empty regular file) as a sparse file: pages that
    // were never touched or are all zero become holes. Returns the bytes of data written.
    uint64_t save_to(int out_fd) const;

    // RAM mapped from a snapshot: the pages this process holds its own copies of, which the
    // guest or a device wrote since the restore (the rest are still the snapshot's files'),
    // and of those the ones whose soft-dirty bit is set (core/soft_dirty.hpp: written since
    // the bits were last cleared), each in order. pagemap_fd: /proc/self/pagemap, opened
    // before the process was jailed. Throws Error on RAM not mapped from a snapshot or a
    // failed read.
    struct PrivatePages {
        std::vector<IndexRun> owned;
        std::vector<IndexRun> soft_dirty;
    };
    PrivatePages private_pages(int pagemap_fd) const;
    // Writes the runs' pages into out_fd at their offsets and sizes it to RAM. All-zero pages
    // are left as holes: in an empty file by skipping them, over data an earlier save wrote
    // (`over_old`) by punching them. Returns the bytes of data written.
    uint64_t save_pages_to(int out_fd, std::span<const IndexRun> runs, bool over_old = false) const;
    bool from_snapshot_file() const { return private_copy_; }

    // Makes pages [first_page, first_page + count) of RAM, numbered as in the backing file, the
    // process's own copies now (MADV_POPULATE_WRITE), as the guest's first write would. For RAM
    // mapped from a snapshot. False when the kernel cannot (before Linux 5.14); throws Error
    // for pages outside RAM or another failure.
    bool populate_private(uint64_t first_page, uint64_t count) const;

    // True when [gpa, gpa+len) lies inside one region (len 0 included, at any in-RAM gpa).
    bool contains(uint64_t gpa, uint64_t len) const noexcept;

    // Host view of [gpa, gpa+len). Throws GuestError when any byte is outside RAM.
    std::span<uint8_t> span(uint64_t gpa, uint64_t len) const;

    void read(uint64_t gpa, std::span<uint8_t> out) const;
    void write(uint64_t gpa, std::span<const uint8_t> in) const;

    template <typename T>
    T read_obj(uint64_t gpa) const
    {
        static_assert(std::is_trivially_copyable_v<T>);
        T value;
        std::memcpy(&value, span(gpa, sizeof(T)).data(), sizeof(T));
        return value;
    }

    template <typename T>
    void write_obj(uint64_t gpa, const T& value) const
    {
        static_assert(std::is_trivially_copyable_v<T>);
        std::memcpy(span(gpa, sizeof(T)).data(), &value, sizeof(T));
    }

private:
    GuestMemory(Fd backing, uint64_t ram_bytes, int map_flags);
    const MemoryRegion* find(uint64_t gpa, uint64_t len) const noexcept;

    void map_layer(const MemoryLayer& layer, const std::string& name);

    Fd memfd_;
    std::vector<Fd> layer_files_;  // kept open for as long as they are mapped
    uint8_t* mapping_ = nullptr;
    bool private_copy_ = false;  // MAP_PRIVATE over a snapshot: the file misses the guest's writes
    uint64_t ram_size_ = 0;
    std::vector<MemoryRegion> regions_;
};

} // namespace agentvm
