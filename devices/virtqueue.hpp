// One split virtqueue, device side (virtio 1.2 §2.7).
//
// Emulates: the descriptor table / available ring / used ring protocol, with
// VIRTIO_RING_F_EVENT_IDX notification suppression in both directions (§2.7.7, §2.7.10).
// Leaves out: packed rings, indirect descriptors (VIRTIO_RING_F_INDIRECT_DESC is never
// offered, so an INDIRECT descriptor is a malformed chain), VIRTIO_F_IN_ORDER.
//
// Everything the guest wrote is copied out of guest RAM exactly once, into a
// DescriptorChain, and validated there (index range, chain length capped at the queue size,
// every buffer inside RAM) before a device looks at it. The queue holds no host pointers;
// every access goes through GuestMemory.
//
// Not thread-safe: the owning transport serializes access (see virtio_mmio.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "core/guest_memory.hpp"

namespace agentvm {

// One guest buffer of a chain, as the device may use it.
struct Descriptor {
    uint64_t addr;
    uint32_t len;
    bool writable;  // VRING_DESC_F_WRITE: the device writes it, else the device reads it

    bool operator==(const Descriptor&) const = default;
};

struct DescriptorChain {
    uint16_t head;  // what goes back into the used ring
    std::vector<Descriptor> descriptors;
};

// The chain at `head` is malformed. The head was already taken off the available ring, so the
// device still owes the driver a used element for it (with length 0 when nothing was written).
class ChainError : public GuestError {
public:
    ChainError(uint16_t head, const std::string& what) : GuestError(what), head_(head) {}
    uint16_t head() const { return head_; }

private:
    uint16_t head_;
};

class Virtqueue {
public:
    // Everything needed to resume the queue; plain data.
    struct State {
        uint16_t size = 0;
        bool ready = false;
        bool event_idx = false;
        uint64_t desc_addr = 0;
        uint64_t avail_addr = 0;
        uint64_t used_addr = 0;
        uint16_t next_avail = 0;
        uint16_t next_used = 0;
        uint16_t signalled_used = 0;

        bool operator==(const State&) const = default;
    };

    // max_size: what QueueNumMax reports; a power of two, 1..32768 (§2.7).
    explicit Virtqueue(uint16_t max_size);

    uint16_t max_size() const { return max_size_; }

    // Configuration the driver writes through the transport while the queue is not ready.
    // Values are kept as written and validated by enable().
    uint16_t size() const { return size_; }
    void set_size(uint16_t size) { size_ = size; }
    uint64_t desc_addr() const { return desc_addr_; }
    uint64_t avail_addr() const { return avail_addr_; }
    uint64_t used_addr() const { return used_addr_; }
    void set_desc_addr(uint64_t gpa) { desc_addr_ = gpa; }
    void set_avail_addr(uint64_t gpa) { avail_addr_ = gpa; }
    void set_used_addr(uint64_t gpa) { used_addr_ = gpa; }

    // Validates size and ring placement (inside RAM, sized and aligned as §2.7 requires) and
    // marks the queue ready. Throws GuestError and stays not ready when the config is bad.
    void enable(const GuestMemory& mem);
    void disable() { ready_ = false; }
    bool ready() const { return ready_; }

    // Set from the negotiated features when the driver sets DRIVER_OK.
    void set_event_idx(bool on) { event_idx_ = on; }
    bool event_idx() const { return event_idx_; }

    // Back to the power-on state (size = max_size, everything else zero).
    void reset();

    // Takes the next available chain, copied and validated. nullopt when the ring is empty
    // or the queue is not ready. Throws ChainError for a malformed chain (the head is
    // consumed; return it with add_used), GuestError when the ring itself is broken (the
    // driver moved avail->idx by more than the queue size, or a ring left RAM) — the queue is
    // then unusable until reset.
    //
    // With event_idx, an empty ring publishes avail_event = next_avail so the driver notifies
    // on its next buffer and stays quiet until then (no exit per request).
    std::optional<DescriptorChain> pop(const GuestMemory& mem);

    // Returns a chain to the driver: len is how many bytes the device wrote into its buffers.
    void add_used(const GuestMemory& mem, uint16_t head, uint32_t len);

    // Whether the driver wants an interrupt for the used elements added since the last call
    // (vring_need_event on used_event with event_idx, else VRING_AVAIL_F_NO_INTERRUPT).
    bool should_notify(const GuestMemory& mem);

    // The driver's avail->idx now.
    uint16_t avail_idx(const GuestMemory& mem) const { return read_avail_idx(mem); }
    // Asks the driver to notify when it adds its next buffer, however many are still
    // available (with event_idx: avail_event = avail->idx; without, the driver notifies
    // anyway). Returns that avail->idx: once avail_idx() differs, the driver has added one.
    uint16_t notify_on_next_buffer(const GuestMemory& mem);

    // Chains popped but not yet returned.
    uint16_t in_flight() const { return static_cast<uint16_t>(next_avail_ - next_used_); }

    State save() const;
    // Validates the state (size a power of two <= max_size, at most `size` chains in flight,
    // rings inside RAM when ready) and throws Error when it does not fit this queue.
    void restore(const State& state, const GuestMemory& mem);

    // Byte sizes of the three parts for a queue of `size` entries (§2.7, incl. event fields).
    static uint64_t desc_table_bytes(uint16_t size) { return 16ull * size; }
    static uint64_t avail_ring_bytes(uint16_t size) { return 6 + 2ull * size; }
    static uint64_t used_ring_bytes(uint16_t size) { return 6 + 8ull * size; }

private:
    uint16_t read_avail_idx(const GuestMemory& mem) const;
    void publish_avail_event(const GuestMemory& mem, uint16_t event);
    DescriptorChain read_chain(const GuestMemory& mem, uint16_t head) const;
    void validate_layout(const GuestMemory& mem) const;  // throws GuestError

    uint16_t max_size_;
    uint16_t size_;
    bool ready_ = false;
    bool event_idx_ = false;
    uint64_t desc_addr_ = 0;
    uint64_t avail_addr_ = 0;
    uint64_t used_addr_ = 0;
    uint16_t next_avail_ = 0;
    uint16_t next_used_ = 0;
    // used->idx as of the last should_notify(): the "old" of vring_need_event.
    uint16_t signalled_used_ = 0;
};

} // namespace agentvm
