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

namespace agentvm {

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
    // guest writes them. Throws Error unless the file is exactly ram_bytes long.
    static GuestMemory from_snapshot(Fd file, uint64_t ram_bytes, const std::string& name);
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

    Fd memfd_;
    uint8_t* mapping_ = nullptr;
    bool private_copy_ = false;  // MAP_PRIVATE over a snapshot: the file misses the guest's writes
    uint64_t ram_size_ = 0;
    std::vector<MemoryRegion> regions_;
};

} // namespace agentvm
