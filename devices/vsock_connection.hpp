// One virtio-vsock stream connection's state machine (virtio 1.2 §5.10.6.3, §5.10.6.4),
// apart from any virtqueue so that tests drive it directly: its phase (connecting,
// established), the shutdown bits each side has asked for, the bounded queue of host bytes
// waiting for the guest, and the credit counters of both directions.
//
// The counters are 32-bit and wrap at 2^32 as the spec's are: every comparison is of a
// difference, which stays right across the wrap. What the guest reports (buf_alloc, fwd_cnt)
// is taken as it comes, and a report that makes no sense (a fwd_cnt ahead of what we sent)
// only leaves the guest without credit; the guest sending beyond the credit we advertised is
// refused (accept_rx) and the device resets the connection.
//
// Leaves out: what a packet is and where it goes (devices/virtio_vsock.hpp), and the replies
// the connection needs sent (devices/vsock_control.hpp).
#pragma once

#include <linux/virtio_vsock.h>

#include <compare>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

namespace agentvm {

inline constexpr uint64_t vsock_host_cid = 2;  // VMADDR_CID_HOST

// A connection, named by its two ports (the CIDs are always host 2 and the guest's).
struct VsockConnId {
    uint32_t host_port = 0;
    uint32_t guest_port = 0;

    auto operator<=>(const VsockConnId&) const = default;
};

// Both directions of a SHUTDOWN; any other bit is unknown.
inline constexpr uint32_t vsock_shutdown_both = VIRTIO_VSOCK_SHUTDOWN_RCV | VIRTIO_VSOCK_SHUTDOWN_SEND;
// Largest payload accepted in one packet from the guest, and sent in one to it: Linux's
// VIRTIO_VSOCK_MAX_PKT_BUF_SIZE. Bounds the copy out of guest RAM.
inline constexpr uint32_t vsock_max_payload = 64 * 1024;

// A connection's credit counters (§5.10.6.3). They start at 0 on every real connection; tests
// start them near 2^32 to cross the wrap.
struct VsockCounters {
    // Guest -> host.
    uint32_t rx_cnt = 0;             // payload bytes received
    uint32_t fwd_cnt = 0;            // ... taken by the host
    uint32_t last_sent_fwd_cnt = 0;  // fwd_cnt the guest last saw from us
    // Host -> guest.
    uint32_t tx_cnt = 0;  // payload bytes delivered
    uint32_t peer_buf_alloc = 0;
    uint32_t peer_fwd_cnt = 0;
};

class VsockConnection {
public:
    // What we advertise as buf_alloc: how much guest data the host may hold un-consumed
    // (Linux's default socket buffer).
    static constexpr uint32_t buf_alloc = 256 * 1024;
    // Host bytes queued before enqueue() refuses more.
    static constexpr uint32_t send_queue_cap = 4 * 1024 * 1024;
    // Once the guest's view of its credit is below this and we have freed space, tell it.
    static constexpr uint32_t credit_update_threshold = vsock_max_payload;

    enum class Phase : uint8_t {
        connecting,   // we sent (or will send) REQUEST; waiting for RESPONSE
        established,
    };

    explicit VsockConnection(Phase phase, VsockCounters start = {}) : phase_(phase), c_(start) {}

    Phase phase() const { return phase_; }
    // The guest's RESPONSE to our REQUEST.
    void establish() { phase_ = Phase::established; }
    const VsockCounters& counters() const { return c_; }

    // --- guest -> host -------------------------------------------------------------------

    // Every packet carries the guest's current credit (§5.10.6.3).
    void record_peer_credit(uint32_t peer_buf_alloc, uint32_t peer_fwd_cnt);
    // `len` payload bytes arrived. False, counting nothing, when they exceed the credit the
    // guest last heard from us: it broke the protocol.
    bool accept_rx(uint32_t len);
    // The host took `bytes` more of what arrived (never more than arrived and was not taken).
    void forwarded(size_t bytes);
    // Whether the guest should hear of space freed since it last heard from us: only once
    // its view of its credit runs low, so that updates stay rare.
    bool credit_update_due() const;
    // The host wants a CREDIT_UPDATE sent (credit_update_due, or the guest's CREDIT_REQUEST):
    // true when one is not already waiting to go out.
    bool want_credit_update();
    // A header for the guest carries fwd_cnt (returned); the guest now knows it. `update`: the
    // header is the CREDIT_UPDATE that want_credit_update() asked for.
    uint32_t advertise(bool update);

    // --- host -> guest -------------------------------------------------------------------

    // What the guest has room for: buf_alloc - (tx_cnt - fwd_cnt) as it reported them.
    uint32_t peer_credit() const;
    // How many more bytes enqueue() takes now: 0 once the host shut down sending or the
    // guest shut down receiving.
    size_t send_budget() const;
    // Queues up to send_budget() bytes; returns how many were taken. A send cut short, or one
    // that fills the queue, asks for take_send_space() to report when it drains.
    size_t enqueue(std::span<const uint8_t> data);
    size_t queued() const { return queued_; }
    // Whether the device has something to send on this connection now: data within the
    // guest's credit, or the host's SHUTDOWN once the data before it is gone.
    bool deliverable() const;
    // The next data packet's payload: at most `room` bytes, the guest's credit and
    // vsock_max_payload. Counts them as delivered.
    std::vector<uint8_t> take_payload(uint64_t room);
    // True once after a full queue has drained to half: the host may send again.
    bool take_send_space();

    // --- shutdown ------------------------------------------------------------------------

    // The host asks to shut down `flags` (masked to vsock_shutdown_both): false when that
    // adds nothing. The SHUTDOWN goes out after the data already queued.
    bool shut_local(uint32_t flags);
    uint32_t local_shutdown() const { return local_shutdown_; }
    // The host's SHUTDOWN went out; returns its flags.
    uint32_t take_shutdown();
    // The guest shut down `flags`: unknown bits are ignored (as Linux does), and what waited
    // for a guest that receives no more is dropped. Returns the known bits.
    uint32_t shut_peer(uint32_t flags);
    uint32_t peer_shutdown() const { return peer_shutdown_; }
    // The guest sends no more: data from it is a protocol violation.
    bool peer_stopped_sending() const { return peer_shutdown_ & VIRTIO_VSOCK_SHUTDOWN_SEND; }
    // The host reads no more: what the guest sends is discarded (and credited).
    bool host_stopped_reading() const { return local_shutdown_ & VIRTIO_VSOCK_SHUTDOWN_RCV; }

private:
    Phase phase_;
    VsockCounters c_;
    uint32_t local_shutdown_ = 0;  // VIRTIO_VSOCK_SHUTDOWN_* the host asked for
    uint32_t peer_shutdown_ = 0;   // ... the guest told us
    bool shutdown_sent_ = false;   // our SHUTDOWN went out (only after the queue drained)
    bool credit_update_queued_ = false;
    bool send_blocked_ = false;    // enqueue() hit the cap: report when it drains
    // Host bytes in chunks, so that enqueue() and take_payload() never move the whole queue.
    std::deque<std::vector<uint8_t>> chunks_;
    size_t front_offset_ = 0;
    size_t queued_ = 0;
};

} // namespace agentvm
