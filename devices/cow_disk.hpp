// A copy-on-write disk: a shared read-only base image plus a private, throwaway overlay.
//
// Every VM boots from the same base image, which is opened O_RDONLY and never written. The
// VM's writes land in an overlay file of the disk's size, created O_TMPFILE (it has no name
// from birth, so nothing is left behind even if the VMM is SIGKILLed) and left sparse; a
// bitmap of 512-byte sectors says which sectors the overlay holds. A read is split into
// runs served from the base or the overlay. The disk may be larger than the base: sectors
// past the base's end live in the overlay alone and read as zeros until written.
//
// A VM restored from a snapshot reads the snapshot's disk file as a read-only layer between
// the base and its overlay (restore()): every clone shares that file and its page cache, and
// a restore copies nothing. A VM booted from a template reads the template's own blocks the
// same way (add_layer()), over the base every template of that source shares; a VM restored
// from a live snapshot (vmm/snapshot.hpp) reads one more layer per snapshot in its chain.
// A sector is read from the overlay, else from the topmost layer holding it, else the base.
//
// The planning (plan_read, mark_written) is pure; read/write submit through the EventLoop
// and complete on its thread. Not thread-safe: the owning device serializes access. Must not
// be moved or destroyed while I/O is in flight (completions refer to it).
// Leaves out: discard, write-zeroes, persisting the overlay (a snapshot copies the disk's own
// sectors itself: overlay_byte_ranges(), layer_byte_ranges()).
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/event_loop.hpp"
#include "common/error.hpp"
#include "common/fd.hpp"

namespace agentvm {

class CowDisk {
public:
    static constexpr uint64_t sector_size = 512;
    // Offsets are off_t and results int32: a disk stays well inside both ranges.
    static constexpr uint64_t max_capacity_bytes = uint64_t{1} << 62;
    // Each layer costs every read a bitmap lookup: a chain deeper than this is refused.
    static constexpr size_t max_layers = 32;

    enum class Source { base, layer, overlay };

    struct Extent {
        uint64_t sector;
        uint64_t count;
        Source source;
        uint32_t layer = 0;  // which layer (0: the lowest), for Source::layer

        bool operator==(const Extent&) const = default;
    };

    struct State {
        uint64_t capacity_sectors = 0;
        // Bit s%64 of word s/64: sector s is the disk's own (the overlay's or the layer's),
        // not the base's.
        std::vector<uint64_t> written;

        bool operator==(const State&) const = default;
    };

    // res: bytes transferred (the whole request) or -errno.
    using Completion = std::function<void(int32_t res)>;

    // Opens base_path read-only. overlay_dir empty: $TMPDIR, else /var/tmp. capacity_bytes 0:
    // the base's size. Throws Error when the base is missing, unreadable, empty or not a
    // multiple of 512 bytes, when the capacity is smaller than the base or not a multiple of
    // 512 bytes, or when the overlay cannot be created.
    explicit CowDisk(const std::string& base_path, const std::string& overlay_dir = {}, uint64_t capacity_bytes = 0);
    // Takes an fd the caller opened (read-only is enough); name is for error messages.
    CowDisk(Fd base, const std::string& name, const std::string& overlay_dir = {}, uint64_t capacity_bytes = 0);

    uint64_t capacity_sectors() const { return capacity_sectors_; }
    uint64_t base_sectors() const { return base_sectors_; }
    int base_fd() const { return base_.get(); }
    int overlay_fd() const { return overlay_.get(); }
    size_t layer_count() const { return layers_.size(); }
    int layer_fd(size_t index) const { return layers_.at(index).file.get(); }

    // [sector, sector+count) lies inside the disk (overflow-safe).
    bool in_range(uint64_t sector, uint64_t count) const;
    // Runs in order, adjacent runs from the same file merged. Throws GuestError when out of range.
    std::vector<Extent> plan_read(uint64_t sector, uint64_t count) const;
    // Records that the overlay now holds these sectors. Throws GuestError when out of range.
    void mark_written(uint64_t sector, uint64_t count);
    // The overlay or a layer holds the sector.
    bool is_written(uint64_t sector) const;
    // Byte ranges [offset, offset+length) of the disk, in order: those the overlay holds, and
    // those reads take from layer `index` (held by neither the overlay nor a higher layer).
    // Together, what a full snapshot of this disk stores; the overlay's alone, what a live
    // snapshot over the one this VM came from stores.
    std::vector<std::pair<uint64_t, uint64_t>> overlay_byte_ranges() const;
    std::vector<std::pair<uint64_t, uint64_t>> layer_byte_ranges(size_t index) const;

    // Reads/writes sizeof(iov) bytes at `sector`. The iovec array is copied; the buffers must
    // stay valid until `done` runs on the loop thread. A write marks its sectors written only
    // once it fully completed. Throws GuestError (nothing submitted) when the size is not a
    // multiple of 512, the range leaves the disk, or there are more than IOV_MAX buffers.
    // A zero-length request completes inline with 0.
    void read(EventLoop& loop, uint64_t sector, std::span<const iovec> iov, Completion done);
    void write(EventLoop& loop, uint64_t sector, std::span<const iovec> iov, Completion done);

    // A live snapshot copies the overlay's sectors while the VM runs, then, with it paused,
    // those written meanwhile: from track_writes() on, every write that completes is also
    // recorded apart, until tracked_byte_ranges() hands them over (as overlay_byte_ranges)
    // and stops.
    void track_writes();
    std::vector<std::pair<uint64_t, uint64_t>> tracked_byte_ranges();

    State save() const;
    // Makes `layer` (a snapshot's disk file of this disk's size, only ever read) hold the
    // sectors `state` marks, under an empty overlay. Throws Error when the state is for a disk
    // of another size or its bitmap is malformed, or when the disk has been written or
    // restored before.
    void restore(const State& state, Fd layer);
    // Puts `layer` (a file of this disk's size, only ever read) holding these byte ranges
    // [offset, offset+length) over the layers so far, under an empty overlay: a template's own
    // blocks over its shared base, a live snapshot's sectors over its parent's. Throws Error
    // when a range is not whole sectors or leaves the disk, when the disk has been written,
    // or when it has max_layers already.
    void add_layer(Fd layer, std::span<const std::pair<uint64_t, uint64_t>> byte_ranges);

private:
    void open_overlay(const std::string& overlay_dir);
    uint64_t check_request(uint64_t sector, std::span<const iovec> iov) const;
    bool in_overlay(uint64_t sector) const;
    // The topmost layer holding the sector, if any.
    std::optional<uint32_t> layer_of(uint64_t sector) const;
    void push_layer(Fd file, std::vector<uint64_t> sectors);
    int fd_of(const Extent& extent) const;

    struct Layer {
        Fd file;
        std::vector<uint64_t> sectors;  // as written_
    };

    Fd base_;
    Fd overlay_;
    std::string name_;
    uint64_t capacity_sectors_ = 0;
    uint64_t base_sectors_ = 0;
    std::vector<uint64_t> written_;  // the overlay's sectors, as State::written
    std::vector<uint64_t> tracked_;  // as written_, since track_writes(); empty when not tracking
    std::vector<Layer> layers_;  // lowest first
};

// The sub-list of iov covering bytes [offset, offset+len) of the concatenated buffers.
// Throws std::out_of_range when the range is longer than the buffers.
std::vector<iovec> slice_iovecs(std::span<const iovec> iov, uint64_t offset, uint64_t len);

} // namespace agentvm
