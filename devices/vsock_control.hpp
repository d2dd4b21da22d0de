// What the virtio-vsock device owes the guest besides stream data, apart from any virtqueue so
// that tests drive it directly: the replies waiting for an rx buffer (RESPONSE, RST,
// CREDIT_UPDATE, our REQUEST), and the TRANSPORT_RESET event for the event queue together
// with the hold it puts on rx (virtio 1.2 §5.10.6.6).
//
// The hold: the driver handles the event (dropping every socket) before it puts the event's
// buffer back on the event queue. Until the event queue's avail index moves past where it was
// when the event went out, nothing goes to rx: a REQUEST the guest took first would be dropped
// with the old sockets.
//
// Leaves out: the bound on replies (the device stops taking tx chains at its own limit), and
// writing packets into guest buffers (devices/virtio_vsock.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>

#include "devices/vsock_connection.hpp"

namespace agentvm {

struct VsockReply {
    VsockConnId id;
    uint16_t op = 0;  // VIRTIO_VSOCK_OP_*
    // The CID we answer from: the host's, except for an RST to a packet the guest addressed
    // elsewhere, which mirrors its dst_cid so the guest can match it to the socket.
    uint64_t src_cid = vsock_host_cid;

    bool operator==(const VsockReply&) const = default;
};

class VsockControl {
public:
    // --- replies, in the order they go out ---------------------------------------------

    void push(VsockConnId id, uint16_t op, uint64_t src_cid = vsock_host_cid);
    size_t size() const { return replies_.size(); }
    bool empty() const { return replies_.empty(); }
    // Removes and returns the oldest reply; nullopt when there is none.
    std::optional<VsockReply> pop();
    // The connection is gone: its replies from the host would name a connection the guest is
    // about to forget. (RSTs mirroring another CID are not the connection's.)
    void forget(VsockConnId id);

    // --- the transport reset event -------------------------------------------------------

    // Queues TRANSPORT_RESET; every reply waiting dies with the connections it named.
    void reset_transport();
    bool event_pending() const { return event_pending_; }
    // The event went into the guest's buffer, at event-queue avail index `avail_idx`: rx waits
    // until the driver's avail index moves past it.
    void event_delivered(uint16_t avail_idx);
    // Whether rx waits for the guest to handle the event. `avail_idx()` reads the event
    // queue's avail index now, only while a delivered event may not be handled yet: the guest
    // need not have set that ring up, and reading one it has not can throw. Once the index
    // has moved, the hold is gone for good.
    template <typename ReadAvail>
    bool rx_held(ReadAvail avail_idx)
    {
        if (event_pending_)
            return true;
        if (!reset_avail_)
            return false;
        if (avail_idx() == *reset_avail_)
            return true;
        reset_avail_.reset();
        return false;
    }

    // The driver reset the device: nothing is owed any more.
    void clear();

private:
    std::deque<VsockReply> replies_;
    bool event_pending_ = false;
    std::optional<uint16_t> reset_avail_;  // see event_delivered
};

} // namespace agentvm
