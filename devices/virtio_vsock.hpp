// virtio-vsock socket device, emulated in the VMM (virtio 1.2 §5.10).
//
// Emulates: the three queues (rx 0, tx 1, event 2; 256 entries each), config space =
// struct virtio_vsock_config (guest_cid), SOCK_STREAM connections between the guest and
// the host (CID 2) with the full op set (REQUEST, RESPONSE, RST, SHUTDOWN, RW,
// CREDIT_UPDATE, CREDIT_REQUEST) and per-connection credit flow control in both
// directions (§5.10.6.3), and the TRANSPORT_RESET event. Features offered:
// VIRTIO_F_VERSION_1, VIRTIO_RING_F_EVENT_IDX.
// Leaves out: SEQPACKET (VIRTIO_VSOCK_F_SEQPACKET is never offered, so such packets are
// reset), guest-to-guest traffic (any dst_cid other than 2 is reset), the close timeout of
// a connection whose peer never answers our SHUTDOWN (the VMM may reset() it).
//
// The device holds no file descriptors: the host side is a VsockBackend the VMM
// implements (host listeners, host sockets), and the reverse direction is the
// connect/send/shutdown/reset API below. Everything the guest writes is copied out of guest
// RAM once (header gathered across descriptors, payload capped at 64 KiB), validated as a
// typed packet (parse_vsock_packet, pure), and only then acted on. A malformed packet never
// stops the device: at worst its connection is reset (RST), and a chain the device cannot
// use at all (wrong direction, shorter than a header) is returned with length 0 and a
// rate-limited warning.
//
// Flow control, both directions (§5.10.6.3):
//  - guest -> host: we advertise buf_alloc = conn_buf_alloc and fwd_cnt = bytes the backend
//    has taken (on_data's return value plus later consumed() calls). A guest that sends
//    beyond that credit broke the protocol: the connection is reset. When the backend
//    frees space and the guest's view of its credit is low, we send CREDIT_UPDATE.
//  - host -> guest: send() queues at most send_queue_cap bytes per connection (the VMM
//    stops reading its socket when send_budget() is 0, and resumes on on_send_space());
//    delivery never exceeds the guest's free credit, buf_alloc - (tx_cnt - fwd_cnt).
//
// Replies the device owes the guest (RESPONSE, RST, CREDIT_UPDATE, …) wait in a bounded
// control queue until the guest posts rx buffers; while it is full the device stops taking
// tx chains, so a guest that sends without ever receiving only stalls itself.
//
// Threads: everything runs on the event-loop thread under mutex(), as for virtio-blk.
// Backend callbacks run with mutex() held; they may call the host-side API (the mutex is
// recursive, and calls made from a callback are queued and delivered when the device
// returns from the callback).
#pragma once

#include <linux/virtio_config.h>
#include <linux/virtio_vsock.h>
// The legacy part of virtio_ring.h (vring_init) is not valid C++; we need none of it.
#ifndef VIRTIO_RING_NO_LEGACY
#define VIRTIO_RING_NO_LEGACY
#endif
#include <linux/virtio_ring.h>

#include <compare>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "devices/virtio_device.hpp"
#include "devices/virtqueue.hpp"
#include "core/guest_memory.hpp"

namespace agentvm {

inline constexpr uint64_t vsock_host_cid = 2;  // VMADDR_CID_HOST
inline constexpr uint32_t vsock_hdr_bytes = sizeof(virtio_vsock_hdr);
// Both directions of a SHUTDOWN; any other bit is unknown.
inline constexpr uint32_t vsock_shutdown_both = VIRTIO_VSOCK_SHUTDOWN_RCV | VIRTIO_VSOCK_SHUTDOWN_SEND;
static_assert(vsock_hdr_bytes == 44);
// Largest payload accepted in one packet from the guest, and sent in one to it: Linux's
// VIRTIO_VSOCK_MAX_PKT_BUF_SIZE. Bounds the copy out of guest RAM.
inline constexpr uint32_t vsock_max_payload = 64 * 1024;

// A connection, named by its two ports (the CIDs are always host 2 and the guest's).
struct VsockConnId {
    uint32_t host_port = 0;
    uint32_t guest_port = 0;

    auto operator<=>(const VsockConnId&) const = default;
};

// What a tx chain turned out to be, before anything is done with it.
struct VsockPacket {
    enum class Kind {
        ok,      // a well-formed STREAM packet for the host: act on hdr.op
        reset,   // a header we can answer, but it is invalid: RST that port pair
        drop,    // unusable chain (wrong direction, no full header): return it, say nothing
    };
    Kind kind = Kind::drop;
    std::string error;      // why it is not ok, for the log
    virtio_vsock_hdr hdr{};  // a copy; valid unless kind == drop
    std::vector<uint8_t> payload;  // a copy of hdr.len bytes (RW only)
};

// Pure: the chain is already a validated copy; the header and payload are copied out of guest
// RAM once, then checked (cids, type, len against the buffers and vsock_max_payload).
VsockPacket parse_vsock_packet(const DescriptorChain& chain, const GuestMemory& mem, uint64_t guest_cid);

// The host side of the device, implemented by the VMM. Called on the loop thread with the
// device's mutex() held.
class VsockBackend {
public:
    virtual ~VsockBackend() = default;

    // The guest connects to host port id.host_port. True accepts (the device answers
    // RESPONSE and the connection is established), false refuses (RST).
    virtual bool on_connect_request(VsockConnId id) = 0;
    // A connect() of ours was accepted by the guest.
    virtual void on_connected(VsockConnId id) = 0;
    // Stream bytes from the guest. Returns how many the host took right away; the rest the
    // backend holds and reports with VirtioVsock::consumed() once it has taken them. Until
    // then they count against the credit the guest may use.
    virtual size_t on_data(VsockConnId id, std::span<const uint8_t> data) = 0;
    // The guest shut down one or both directions (VIRTIO_VSOCK_SHUTDOWN_RCV / _SEND).
    virtual void on_shutdown(VsockConnId id, uint32_t flags) = 0;
    // The connection is gone for a reason the host did not ask for: guest RST, guest closed
    // both directions, guest broke the protocol, a refused connect(), device or transport
    // reset. Not called for the host's own reset(). When the driver resets the device this
    // runs on the thread that wrote Status (a vCPU thread), still under mutex().
    virtual void on_closed(VsockConnId id) = 0;
    // The connection's send queue, which was full, has room again.
    virtual void on_send_space(VsockConnId) {}
};

class VirtioVsock : public VirtioDevice {
public:
    static constexpr uint16_t queue_size = 256;
    static constexpr size_t rx_queue = 0;
    static constexpr size_t tx_queue = 1;
    static constexpr size_t event_queue = 2;
    static constexpr uint64_t features = (1ull << VIRTIO_F_VERSION_1) | (1ull << VIRTIO_RING_F_EVENT_IDX);

    // What we advertise as buf_alloc on every connection: how much guest data the backend
    // may hold un-consumed (Linux's default socket buffer).
    static constexpr uint32_t conn_buf_alloc = 256 * 1024;
    // Host bytes queued per connection before send() refuses more.
    static constexpr uint32_t send_queue_cap = 4 * 1024 * 1024;
    // Once the guest's view of its credit is below this and we have freed space, tell it.
    static constexpr uint32_t credit_update_threshold = vsock_max_payload;
    static constexpr size_t max_connections = 1024;
    // Replies owed to the guest; at this many the device stops taking tx chains.
    static constexpr size_t max_pending_control = 4 * queue_size;

    enum class ConnState : uint8_t {
        connecting,   // we sent (or will send) REQUEST; waiting for RESPONSE
        established,
    };

    // Plain data, for save/restore.
    struct ConnectionState {
        VsockConnId id;
        ConnState state = ConnState::established;
        uint32_t local_shutdown = 0;  // VIRTIO_VSOCK_SHUTDOWN_* the host asked for
        uint32_t peer_shutdown = 0;   // ... the guest told us
        bool shutdown_sent = false;   // our SHUTDOWN went out (only after pending drained)
        bool credit_update_queued = false;
        bool send_blocked = false;    // send() hit the cap: tell the backend when it drains
        // Guest -> host.
        uint32_t rx_cnt = 0;             // payload bytes received
        uint32_t fwd_cnt = 0;            // ... taken by the backend
        uint32_t last_sent_fwd_cnt = 0;  // fwd_cnt the guest last saw from us
        // Host -> guest.
        uint32_t tx_cnt = 0;  // payload bytes delivered
        uint32_t peer_buf_alloc = 0;
        uint32_t peer_fwd_cnt = 0;
        std::vector<uint8_t> pending;  // queued by send(), not yet delivered

        bool operator==(const ConnectionState&) const = default;
    };

    struct ControlState {
        VsockConnId id;
        uint16_t op = 0;
        uint32_t flags = 0;
        // The CID we answer from: 2, except for an RST to a packet the guest addressed
        // elsewhere, which mirrors its dst_cid so the guest can match it to the socket.
        uint64_t src_cid = vsock_host_cid;

        bool operator==(const ControlState&) const = default;
    };

    struct State {
        uint64_t guest_cid = 0;
        std::vector<ConnectionState> connections;  // sorted by id
        std::vector<ControlState> control;          // in delivery order
        bool event_pending = false;
        std::optional<uint16_t> reset_avail;  // see reset_avail_

        bool operator==(const State&) const = default;
    };

    // guest_cid: what the guest reads from config space (> 2, fits 32 bits as Linux requires).
    // backend must outlive the device.
    explicit VirtioVsock(VsockBackend& backend, uint64_t guest_cid = 3);

    uint32_t device_type() const override;
    uint64_t device_features() const override { return features; }
    size_t queue_count() const override { return 3; }
    uint16_t queue_max_size(size_t) const override { return queue_size; }
    void read_config(uint64_t offset, std::span<uint8_t> data) const override;
    void write_config(uint64_t offset, std::span<const uint8_t> data) override;
    void activate(const VirtioContext& ctx) override;
    void process_queue(size_t index) override;
    void reset() override;

    uint64_t guest_cid() const { return guest_cid_; }

    // --- host side, called by the VMM on the loop thread ---------------------------------

    // Opens a connection from host port host_port to a guest listener on guest_port: queues
    // REQUEST; the backend hears on_connected() or on_closed(). False when the device is not
    // active, the id is in use, or there are max_connections already.
    bool connect(VsockConnId id);
    // Queues up to send_budget(id) bytes for the guest; returns how many were taken (0 for an
    // unknown or send-shut connection). Data sent while connecting waits for RESPONSE.
    size_t send(VsockConnId id, std::span<const uint8_t> data);
    size_t send_budget(VsockConnId id) const;
    bool can_accept_send(VsockConnId id) const { return send_budget(id) > 0; }
    // The backend took `bytes` more of what on_data left it: advances our fwd_cnt.
    void consumed(VsockConnId id, size_t bytes);
    // Host will send no more (SHUTDOWN_SEND) and/or receive no more (SHUTDOWN_RCV); the
    // SHUTDOWN goes out after the data already queued.
    void shutdown(VsockConnId id, uint32_t flags = vsock_shutdown_both);
    // Drops the connection now (queued data too) and tells the guest with RST.
    void reset(VsockConnId id);
    // Queues VIRTIO_VSOCK_EVENT_TRANSPORT_RESET (the guest then drops its sockets and
    // re-reads guest_cid) and drops every connection (the backend hears on_closed for each).
    // Nothing goes to the guest's rx queue until it has handled the event, so a connection
    // opened right after (a restore's first) is not dropped with the old ones.
    void send_transport_reset();

    bool has_connection(VsockConnId id) const;
    size_t connection_count() const;

    // Restore the device before the transport, as for every device: restore() stages the
    // connections, and the one reset() the transport's restore does before re-activating the
    // device keeps them (any later reset() is a driver reset and drops them). Throws Error,
    // changing nothing, when the state is invalid.
    // The bytes the guest sent that the old backend had not consumed() are not part of the
    // state: after a restore the new backend must account for them, or (the expected path
    // for snapshots) the VMM calls send_transport_reset().
    State save() const;
    void restore(const State& state);

private:
    struct Connection {
        ConnectionState s;
        // s.pending is unused while live; host bytes wait here in chunks so send() and
        // delivery never move the whole queue.
        std::deque<std::vector<uint8_t>> chunks;
        size_t front_offset = 0;
        size_t queued = 0;
    };

    void pump();
    bool drain_tx();  // true when it stopped because the control queue is full
    void deliver_rx();
    void deliver_events();
    bool awaiting_reset();
    void handle_packet(const VsockPacket& pkt);
    void handle_rw(VsockConnId id, Connection& conn, const VsockPacket& pkt);
    void queue_control(VsockConnId id, uint16_t op, uint32_t flags = 0, uint64_t src_cid = vsock_host_cid);
    void queue_credit_update(VsockConnId id, Connection& conn);
    // Drops the connection; reply RST when `rst`; tell the backend when `notify`.
    void drop_connection(VsockConnId id, bool rst, bool notify);
    uint32_t peer_credit(const Connection& conn) const;
    bool deliverable(const Connection& conn) const;
    void maybe_credit_update(VsockConnId id, Connection& conn);
    void mark_used(size_t queue, uint16_t head, uint32_t len);
    Connection* find(VsockConnId id);
    const Connection* find(VsockConnId id) const;

    VsockBackend& backend_;

    // Guarded by mutex().
    uint64_t guest_cid_;
    VirtioContext ctx_;
    bool active_ = false;
    bool broken_ = false;  // a ring failed; nothing moves until reset
    std::map<VsockConnId, Connection> conns_;
    std::deque<ControlState> control_;
    bool event_pending_ = false;
    // The event queue's avail->idx when the transport reset went out. The driver puts the
    // event's buffer back only after handling it (dropping every socket), so until avail->idx
    // moves past this, rx waits: a REQUEST the guest took first would be dropped with the rest.
    std::optional<uint16_t> reset_avail_;
    VsockConnId rr_cursor_{};  // round robin between connections with data
    bool restored_ = false;  // restore() ran and no activate() since: see restore()
    bool pumping_ = false;
    bool repump_ = false;
    bool used_added_[3] = {};
    WarnLimiter warn_;
};

} // namespace agentvm
