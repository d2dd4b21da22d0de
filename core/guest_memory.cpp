#include "core/guest_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <utility>

#include "core/layout.hpp"
#include "core/soft_dirty.hpp"

namespace agentvm {

namespace {

using layout::page_size;

Fd new_ram_memfd(uint64_t ram_bytes)
{
    if (ram_bytes == 0 || ram_bytes % page_size != 0)
        throw Error("guest memory size must be a non-zero multiple of 4 KiB");
    Fd fd(::memfd_create("agentvm-guest-ram", MFD_CLOEXEC));
    if (!fd)
        throw_errno("memfd_create for guest RAM");
    if (::ftruncate(fd.get(), static_cast<off_t>(ram_bytes)) != 0)
        throw_errno("sizing guest RAM memfd");
    return fd;
}

bool all_zero(const uint8_t* page)
{
    static const uint8_t zeros[page_size] = {};
    return std::memcmp(page, zeros, page_size) == 0;
}

void write_all_at(int fd, const uint8_t* data, uint64_t len, uint64_t offset)
{
    while (len > 0) {
        const ssize_t n = ::pwrite(fd, data, len, static_cast<off_t>(offset));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            throw_errno("writing guest memory to the snapshot");
        data += n;
        offset += static_cast<uint64_t>(n);
        len -= static_cast<uint64_t>(n);
    }
}

} // namespace

GuestMemory::GuestMemory(uint64_t ram_bytes) : GuestMemory(new_ram_memfd(ram_bytes), ram_bytes, MAP_SHARED)
{
}

namespace {

void check_memory_file(int fd, uint64_t ram_bytes, const std::string& name)
{
    struct stat st {};
    if (::fstat(fd, &st) != 0)
        throw_errno(fmt::format("snapshot memory '{}'", name));
    if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != ram_bytes || ram_bytes % page_size != 0)
        throw Error(fmt::format("snapshot memory '{}' is {} bytes, not the {} bytes of guest RAM the "
                                "snapshot records: truncated or from another snapshot",
                                name, st.st_size, ram_bytes));
}

// A pagemap entry (Documentation/admin-guide/mm/pagemap.rst): present, swapped, and "file
// page or shared anonymous". In a MAP_PRIVATE file mapping a present page that is not a
// file page, or a swapped one, is the process's own copy.
constexpr uint64_t pagemap_present = uint64_t{1} << 63;
constexpr uint64_t pagemap_swapped = uint64_t{1} << 62;
constexpr uint64_t pagemap_file = uint64_t{1} << 61;

bool is_private_copy(uint64_t entry)
{
    return (entry & pagemap_swapped) || ((entry & pagemap_present) && !(entry & pagemap_file));
}

} // namespace

GuestMemory GuestMemory::from_snapshot(Fd file, uint64_t ram_bytes, const std::string& name,
                                       std::vector<MemoryLayer> layers)
{
    check_memory_file(file.get(), ram_bytes, name);
    for (size_t i = 0; i < layers.size(); ++i)
        check_memory_file(layers[i].file.get(), ram_bytes, fmt::format("{} (layer {})", name, i + 1));
    GuestMemory mem(std::move(file), ram_bytes, MAP_PRIVATE);
    for (size_t i = 0; i < layers.size(); ++i) {
        mem.map_layer(layers[i], fmt::format("{} (layer {})", name, i + 1));
        mem.layer_files_.push_back(std::move(layers[i].file));
    }
    return mem;
}

void GuestMemory::map_layer(const MemoryLayer& layer, const std::string& name)
{
    const uint64_t pages = ram_size_ / page_size;
    for (const IndexRun& run : layer.pages) {
        if (run.count == 0 || run.first > pages || run.count > pages - run.first)
            throw Error(fmt::format("snapshot memory '{}': pages [{}, +{}) are outside the {} pages of guest RAM", name,
                                    run.first, run.count, pages));
        // Over the pages below, at the same place: KVM's memslots name addresses, not mappings.
        void* at = ::mmap(mapping_ + run.first * page_size, run.count * page_size, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE, layer.file.get(),
                          static_cast<off_t>(run.first * page_size));
        if (at == MAP_FAILED)
            throw_errno(fmt::format("mapping pages [{}, +{}) of snapshot memory '{}'", run.first, run.count, name));
    }
}

GuestMemory::PrivatePages GuestMemory::private_pages(int pagemap_fd) const
{
    if (!private_copy_)
        throw Error("guest RAM is not mapped from a snapshot: it has no pages of its own to tell apart");
    PrivatePages found;
    const auto add = [](std::vector<IndexRun>& runs, uint64_t page) {
        if (!runs.empty() && runs.back().first + runs.back().count == page)
            ++runs.back().count;
        else
            runs.push_back({page, 1});
    };
    const uint64_t pages = ram_size_ / page_size;
    constexpr uint64_t chunk = 4096;  // entries per read: 32 KiB
    std::vector<uint64_t> entries(chunk);
    const uint64_t first_entry = reinterpret_cast<uintptr_t>(mapping_) / page_size;
    for (uint64_t page = 0; page < pages; page += chunk) {
        const uint64_t count = std::min(chunk, pages - page);
        const size_t bytes = count * sizeof(uint64_t);
        const ssize_t n = ::pread(pagemap_fd, entries.data(), bytes, static_cast<off_t>((first_entry + page) * 8));
        if (n != static_cast<ssize_t>(bytes))
            throw_errno("reading /proc/self/pagemap for guest RAM", n < 0 ? errno : EIO);
        for (uint64_t i = 0; i < count; ++i) {
            if (!is_private_copy(entries[i]))
                continue;
            add(found.owned, page + i);
            if (entries[i] & pagemap_soft_dirty)
                add(found.soft_dirty, page + i);
        }
    }
    return found;
}

uint64_t GuestMemory::save_pages_to(int out_fd, std::span<const IndexRun> runs, bool over_old) const
{
    const uint64_t pages = ram_size_ / page_size;
    uint64_t written = 0;
    for (const IndexRun& run : runs) {
        if (run.first > pages || run.count > pages - run.first)
            throw Error(fmt::format("pages [{}, +{}) are outside the {} pages of guest RAM", run.first, run.count, pages));
        uint64_t page = run.first * page_size;
        const uint64_t end = (run.first + run.count) * page_size;
        while (page < end) {
            const uint64_t zeros_start = page;
            while (page < end && all_zero(mapping_ + page))
                page += page_size;
            if (over_old && page > zeros_start
                && ::fallocate(out_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(zeros_start),
                               static_cast<off_t>(page - zeros_start)) != 0)
                throw_errno("punching zero pages out of the snapshot memory file");
            uint64_t data_end = page;
            while (data_end < end && !all_zero(mapping_ + data_end))
                data_end += page_size;
            if (data_end > page) {
                write_all_at(out_fd, mapping_ + page, data_end - page, page);
                written += data_end - page;
            }
            page = data_end;
        }
    }
    if (::ftruncate(out_fd, static_cast<off_t>(ram_size_)) != 0)
        throw_errno("sizing the snapshot memory file");
    return written;
}

GuestMemory::GuestMemory(Fd backing, uint64_t ram_bytes, int map_flags)
    : memfd_(std::move(backing)), private_copy_(map_flags == MAP_PRIVATE), ram_size_(ram_bytes)
{
    if (ram_bytes == 0 || ram_bytes % page_size != 0)
        throw Error("guest memory size must be a non-zero multiple of 4 KiB");
    // MAP_NORESERVE: guest RAM is touched lazily; a 4 GiB guest that uses 200 MiB costs 200 MiB.
    void* addr = ::mmap(nullptr, ram_bytes, PROT_READ | PROT_WRITE, map_flags | MAP_NORESERVE,
                        memfd_.get(), 0);
    if (addr == MAP_FAILED)
        throw_errno("mapping guest RAM");
    mapping_ = static_cast<uint8_t*>(addr);

    const uint64_t low = std::min(ram_bytes, layout::mmio_gap_start);
    regions_.push_back({0, low, 0, mapping_});
    if (ram_bytes > low)
        regions_.push_back({layout::mmio_gap_end, ram_bytes - low, low, mapping_ + low});
}

bool GuestMemory::populate_private(uint64_t first_page, uint64_t count) const
{
    const uint64_t pages = ram_size_ / page_size;
    if (first_page > pages || count > pages - first_page)
        throw Error(fmt::format("pages [{}, +{}) are outside the {} pages of guest RAM", first_page, count, pages));
    // The file's pages are contiguous in the mapping, across the MMIO gap too.
    if (::madvise(mapping_ + first_page * page_size, count * page_size, MADV_POPULATE_WRITE) == 0)
        return true;
    if (errno == EINVAL)
        return false;
    throw_errno(fmt::format("making guest pages [{}, +{}) private", first_page, count));
}

uint64_t GuestMemory::save_to(int out_fd) const
{
    uint64_t written = 0;
    uint64_t offset = 0;
    while (offset < ram_size_) {
        // Ranges the memfd has never had written are holes already: skip them without
        // touching their pages (which would allocate them). A private copy of a snapshot has
        // the guest's writes outside the file, so all of it is scanned.
        off_t data = static_cast<off_t>(offset);
        off_t hole = static_cast<off_t>(ram_size_);
        if (!private_copy_) {
            data = ::lseek(memfd_.get(), static_cast<off_t>(offset), SEEK_DATA);
            if (data < 0 && errno == ENXIO)
                break;
            if (data < 0)
                throw_errno("finding guest RAM in use (SEEK_DATA)");
            hole = ::lseek(memfd_.get(), data, SEEK_HOLE);
            if (hole < 0)
                throw_errno("finding guest RAM in use (SEEK_HOLE)");
        }
        const uint64_t end = std::min<uint64_t>(static_cast<uint64_t>(hole), ram_size_);
        // Within data, runs of non-zero pages become one write each.
        uint64_t page = static_cast<uint64_t>(data) & ~(page_size - 1);
        while (page < end) {
            while (page < end && all_zero(mapping_ + page))
                page += page_size;
            uint64_t run_end = page;
            while (run_end < end && !all_zero(mapping_ + run_end))
                run_end += page_size;
            if (run_end > page) {
                write_all_at(out_fd, mapping_ + page, run_end - page, page);
                written += run_end - page;
            }
            page = run_end;
        }
        offset = end;
    }
    if (::ftruncate(out_fd, static_cast<off_t>(ram_size_)) != 0)
        throw_errno("sizing the snapshot memory file");
    return written;
}

GuestMemory::GuestMemory(GuestMemory&& other) noexcept
    : memfd_(std::move(other.memfd_)),
      layer_files_(std::move(other.layer_files_)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      private_copy_(other.private_copy_),
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
