// virtio-blk over a copy-on-write disk (virtio 1.2 §5.2).
//
// Emulates: one request queue of 256 entries; VIRTIO_BLK_T_IN, T_OUT, T_FLUSH and T_GET_ID;
// config space = struct virtio_blk_config with capacity and seg_max. Features offered:
// VIRTIO_F_VERSION_1, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_SEG_MAX, VIRTIO_RING_F_EVENT_IDX.
// Leaves out: multiqueue, discard / write-zeroes / secure erase / zoned commands (answered
// VIRTIO_BLK_S_UNSUPP), config writeback (WCE), read-only mode, indirect descriptors, and
// arbitrary message framing: like Linux's driver we expect the 16-byte header alone in the
// first (readable) descriptor and the status byte as the last byte of the last (writable)
// descriptor; other framings are answered VIRTIO_BLK_S_IOERR.
//
// Parsing (parse_blk_request) is pure: the chain is already a validated copy, the header is
// copied out of guest RAM once, and the typed request is checked in full before any I/O.
// A malformed request never stops the device: it gets VIRTIO_BLK_S_IOERR when it has a
// usable status byte, else it is returned with length 0 and a rate-limited warning.
#pragma once

#include <linux/virtio_blk.h>
#include <linux/virtio_config.h>
// The legacy part of virtio_ring.h (vring_init) is not valid C++; we need none of it.
#ifndef VIRTIO_RING_NO_LEGACY
#define VIRTIO_RING_NO_LEGACY
#endif
#include <linux/virtio_ring.h>

#include <condition_variable>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "devices/cow_disk.hpp"
#include "devices/virtio_device.hpp"
#include "devices/virtqueue.hpp"
#include "core/event_loop.hpp"
#include "core/guest_memory.hpp"

namespace agentvm {

struct BlkRequest {
    // VIRTIO_BLK_S_OK: valid, go ahead. Otherwise answer with this status and do nothing.
    uint8_t status = VIRTIO_BLK_S_OK;
    std::string error;  // why it was rejected, for the log
    uint32_t type = 0;  // VIRTIO_BLK_T_*
    uint64_t sector = 0;
    std::vector<Descriptor> data;  // the buffers between header and status
    uint64_t data_len = 0;
    // Guest address of the status byte; nullopt when the chain has none we may write.
    std::optional<uint64_t> status_addr;
};

// Largest IN/OUT payload accepted: far above what Linux issues (max_sectors_kb), and small
// enough that the byte count fits the used ring's 32-bit length.
inline constexpr uint64_t blk_max_request_bytes = 1ull << 30;

BlkRequest parse_blk_request(const DescriptorChain& chain, const GuestMemory& mem, uint64_t capacity_sectors);

class VirtioBlk : public VirtioDevice {
public:
    static constexpr uint16_t queue_size = 256;
    // Data descriptors per request: a chain is at most queue_size long, minus header and status.
    static constexpr uint32_t seg_max = queue_size - 2;
    static constexpr uint64_t features = (1ull << VIRTIO_F_VERSION_1) | (1ull << VIRTIO_BLK_F_FLUSH) |
                                         (1ull << VIRTIO_BLK_F_SEG_MAX) | (1ull << VIRTIO_RING_F_EVENT_IDX);

    struct State {
        CowDisk::State disk;

        bool operator==(const State&) const = default;
    };

    // serial: what GET_ID returns (up to VIRTIO_BLK_ID_BYTES bytes; longer is cut).
    // The loop must outlive the device, and must be drained (EventLoop::drain) before the
    // device is destroyed, since completions refer to it.
    VirtioBlk(CowDisk disk, EventLoop& loop, std::string serial = "agentvm-root");

    uint32_t device_type() const override;
    uint64_t device_features() const override { return features; }
    size_t queue_count() const override { return 1; }
    uint16_t queue_max_size(size_t) const override { return queue_size; }
    void read_config(uint64_t offset, std::span<uint8_t> data) const override;
    void write_config(uint64_t offset, std::span<const uint8_t> data) override;
    void activate(const VirtioContext& ctx) override;
    void process_queue(size_t index) override;
    // Returns once no request is in flight: a read still running would write guest memory
    // after the driver saw the reset. So the I/O loop must be running on another thread (or
    // abandon_resets() have been called).
    void reset() override;
    // The VM is stopping and its I/O loop will complete nothing more until the vCPUs are
    // joined: a reset waiting for requests returns at once (the drain waits for them instead).
    void abandon_resets();

    // Disk operations submitted whose completion has not run (including ones from before a reset).
    size_t in_flight() const;
    const CowDisk& disk() const { return disk_; }
    CowDisk& disk() { return disk_; }

    // Quiesce first: throws Error while requests are in flight.
    State save() const;
    // Call before restoring the transport; disk_layer is the snapshot's disk file
    // (CowDisk::restore). Throws Error on a mismatched disk or while busy.
    void restore(const State& state, Fd disk_layer);
    // A restore through a chain of snapshots: each layer (lowest first, its file and the byte
    // ranges it holds) goes over the one below (CowDisk::add_layer), and together they must
    // hold exactly the sectors `state` records. Throws Error otherwise or while busy.
    void restore(const State& state, std::vector<std::pair<Fd, std::vector<std::pair<uint64_t, uint64_t>>>> layers);

private:
    void handle(Virtqueue& queue, const DescriptorChain& chain, bool& used_added);
    void complete(Virtqueue& queue, uint16_t head, std::optional<uint64_t> status_addr, uint8_t status,
                  uint32_t used_len);
    void submit(Virtqueue& queue, const BlkRequest& req, uint16_t head, bool& used_added);

    CowDisk disk_;
    EventLoop& loop_;
    std::string serial_;

    // Guarded by mutex().
    VirtioContext ctx_;
    bool active_ = false;
    uint64_t generation_ = 0;  // bumped by reset(): completions from before it are dropped
    size_t in_flight_ = 0;
    bool abandon_resets_ = false;
    std::condition_variable_any quiesced_;  // in_flight_ reached 0, or abandon_resets_
    WarnLimiter warn_;
};

} // namespace agentvm
