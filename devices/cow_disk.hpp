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
// same way (add_layer()), over the base every template of that source shares.
//
// The planning (plan_read, mark_written) is pure; read/write submit through the EventLoop
// and complete on its thread. Not thread-safe: the owning device serializes access. Must not
// be moved or destroyed while I/O is in flight (completions refer to it).
// Leaves out: discard, write-zeroes, persisting the overlay (a snapshot copies the disk's own
// sectors itself: overlay_byte_ranges(), layer_byte_ranges()), layers of layers.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <functional>
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

    enum class Source { base, layer, overlay };

    struct Extent {
        uint64_t sector;
        uint64_t count;
        Source source;

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
    int layer_fd() const { return layer_file_.get(); }  // -1 without a layer

    // [sector, sector+count) lies inside the disk (overflow-safe).
    bool in_range(uint64_t sector, uint64_t count) const;
    // Runs in order, adjacent runs from the same file merged. Throws GuestError when out of range.
    std::vector<Extent> plan_read(uint64_t sector, uint64_t count) const;
    // Records that the overlay now holds these sectors. Throws GuestError when out of range.
    void mark_written(uint64_t sector, uint64_t count);
    // The overlay or the layer holds the sector.
    bool is_written(uint64_t sector) const;
    // Byte ranges [offset, offset+length) of the disk, in order: those the overlay holds, and
    // those only the layer holds. Together, what a snapshot of this disk stores.
    std::vector<std::pair<uint64_t, uint64_t>> overlay_byte_ranges() const;
    std::vector<std::pair<uint64_t, uint64_t>> layer_byte_ranges() const;

    // Reads/writes sizeof(iov) bytes at `sector`. The iovec array is copied; the buffers must
    // stay valid until `done` runs on the loop thread. A write marks its sectors written only
    // once it fully completed. Throws GuestError (nothing submitted) when the size is not a
    // multiple of 512, the range leaves the disk, or there are more than IOV_MAX buffers.
    // A zero-length request completes inline with 0.
    void read(EventLoop& loop, uint64_t sector, std::span<const iovec> iov, Completion done);
    void write(EventLoop& loop, uint64_t sector, std::span<const iovec> iov, Completion done);

    State save() const;
    // Makes `layer` (a snapshot's disk file of this disk's size, only ever read) hold the
    // sectors `state` marks, under an empty overlay. Throws Error when the state is for a disk
    // of another size or its bitmap is malformed, or when the disk has been written or
    // restored before.
    void restore(const State& state, Fd layer);
    // Makes `layer` (a file of this disk's size, only ever read) hold these byte ranges
    // [offset, offset+length) under an empty overlay: a template's own blocks over its
    // shared base. Throws Error when a range is not whole sectors or leaves the disk, or as
    // restore() does.
    void add_layer(Fd layer, std::span<const std::pair<uint64_t, uint64_t>> byte_ranges);

private:
    void open_overlay(const std::string& overlay_dir);
    uint64_t check_request(uint64_t sector, std::span<const iovec> iov) const;
    bool in_overlay(uint64_t sector) const;
    bool in_layer(uint64_t sector) const;
    int fd_of(Source source) const;

    Fd base_;
    Fd overlay_;
    Fd layer_file_;
    std::string name_;
    uint64_t capacity_sectors_ = 0;
    uint64_t base_sectors_ = 0;
    std::vector<uint64_t> written_;  // the overlay's sectors, as State::written
    std::vector<uint64_t> layer_sectors_;  // as written_, for the layer; empty without one
};

// The sub-list of iov covering bytes [offset, offset+len) of the concatenated buffers.
// Throws std::out_of_range when the range is longer than the buffers.
std::vector<iovec> slice_iovecs(std::span<const iovec> iov, uint64_t offset, uint64_t len);

} // namespace agentvm
