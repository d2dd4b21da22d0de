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
// Snapshots: a restore keeps no connection, as in Firecracker: the host sockets did not
// survive, so the VMM sends the TRANSPORT_RESET event after every restore and the guest drops
// its sockets and connects again. The device's State is only what the guest sees of it that
// outlives that, its CID; the queues are the transport's.
//
// The parts: each connection's state machine is a VsockConnection
// (devices/vsock_connection.hpp), the replies and the reset event a VsockControl
// (devices/vsock_control.hpp); this class parses the guest's packets, moves them between the
// queues and those two, and calls the backend.
//
// Threads: everything runs on the event-loop thread under mutex(), as for virtio-blk, except
// a driver reset, which runs on the vCPU thread that wrote Status (see on_reset). Backend
// callbacks run with mutex() held; they may call the host-side API (the mutex is recursive,
// and calls made from a callback are queued and delivered when the device returns from the
// callback).
#pragma once

#include <linux/virtio_config.h>
#include <linux/virtio_vsock.h>
// The legacy part of virtio_ring.h (vring_init) is not valid C++; we need none of it.
#ifndef VIRTIO_RING_NO_LEGACY
#define VIRTIO_RING_NO_LEGACY
#endif
#include <linux/virtio_ring.h>

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "devices/virtio_device.hpp"
#include "devices/virtqueue.hpp"
#include "devices/vsock_connection.hpp"
#include "devices/vsock_control.hpp"
#include "core/guest_memory.hpp"

namespace agentvm {

inline constexpr uint32_t vsock_hdr_bytes = sizeof(virtio_vsock_hdr);
static_assert(vsock_hdr_bytes == 44);

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

// The host side of the device, implemented by the VMM. Called with the device's mutex()
// held, on the loop thread except on_reset.
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
    // both directions, guest broke the protocol, a refused connect(), a transport reset. Not
    // called for the host's own reset(), nor for a driver reset (on_reset).
    virtual void on_closed(VsockConnId id) = 0;
    // The driver reset the device, and these connections went with it. Runs on the thread
    // that wrote Status, a vCPU thread: the backend records what to undo and leaves the
    // undoing (closing host sockets) to its own thread.
    virtual void on_reset(std::span<const VsockConnId> ids) = 0;
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

    static constexpr uint32_t conn_buf_alloc = VsockConnection::buf_alloc;
    static constexpr uint32_t send_queue_cap = VsockConnection::send_queue_cap;
    static constexpr size_t max_connections = 1024;
    // Replies owed to the guest; at this many the device stops taking tx chains.
    static constexpr size_t max_pending_control = 4 * queue_size;

    // Plain data, for save/restore: see "Snapshots" above.
    struct State {
        uint64_t guest_cid = 0;

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

    // Restore the device before the transport, as for every device, then call
    // send_transport_reset(). Throws Error, changing nothing, when the state is invalid.
    State save() const;
    void restore(const State& state);

private:
    void pump();
    bool drain_tx();  // true when it stopped because the reply queue is full
    void deliver_rx();
    void deliver_events();
    void handle_packet(const VsockPacket& pkt);
    void handle_rw(VsockConnId id, VsockConnection& conn, const VsockPacket& pkt);
    void queue_credit_update(VsockConnId id, VsockConnection& conn);
    // Drops the connection; reply RST when `rst`; tell the backend when `notify`.
    void drop_connection(VsockConnId id, bool rst, bool notify);
    std::optional<VsockConnId> next_with_data() const;
    void mark_used(size_t queue, uint16_t head, uint32_t len);
    VsockConnection* find(VsockConnId id);
    const VsockConnection* find(VsockConnId id) const;

    VsockBackend& backend_;

    // Guarded by mutex().
    uint64_t guest_cid_;
    VirtioContext ctx_;
    bool active_ = false;
    bool broken_ = false;  // a ring failed; nothing moves until reset
    std::map<VsockConnId, VsockConnection> conns_;
    VsockControl control_;
    VsockConnId rr_cursor_{};  // round robin between connections with data
    bool pumping_ = false;
    bool repump_ = false;
    bool used_added_[3] = {};
    WarnLimiter warn_;
};

} // namespace agentvm
