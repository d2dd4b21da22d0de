// What the vsock device owes the guest besides data (devices/vsock_control.hpp), without a
// virtqueue: replies in order, forgetting a connection's, and the hold a transport reset
// puts on rx until the guest has handled the event.
#include <doctest/doctest.h>

#include <linux/virtio_vsock.h>

#include <cstdint>

#include "devices/vsock_control.hpp"

using namespace agentvm;

namespace {

// The event queue's avail index, as the device reads it from guest RAM.
auto avail(uint16_t idx)
{
    return [idx] { return idx; };
}

// An event queue the guest never set up: reading it would throw.
uint16_t unreadable()
{
    FAIL("the event queue's avail index was read with no event outstanding");
    return 0;
}

} // namespace

TEST_CASE("replies go out in order; a dropped connection's go with it")
{
    VsockControl c;
    CHECK(c.empty());
    CHECK_FALSE(c.pop());
    const VsockConnId a{1, 2};
    const VsockConnId b{3, 4};
    c.push(a, VIRTIO_VSOCK_OP_RESPONSE);
    c.push(b, VIRTIO_VSOCK_OP_REQUEST);
    c.push(a, VIRTIO_VSOCK_OP_CREDIT_UPDATE);
    c.push(a, VIRTIO_VSOCK_OP_RST, 7);  // to a packet the guest sent to CID 7: not a's
    CHECK(c.size() == 4);
    c.forget(a);
    CHECK(c.size() == 2);
    CHECK(*c.pop() == VsockReply{b, VIRTIO_VSOCK_OP_REQUEST, vsock_host_cid});
    CHECK(*c.pop() == VsockReply{a, VIRTIO_VSOCK_OP_RST, 7});
    CHECK(c.empty());
}

TEST_CASE("a transport reset drops the replies and holds rx until the guest has handled it")
{
    VsockControl c;
    CHECK_FALSE(c.rx_held(unreadable));
    c.push({1, 2}, VIRTIO_VSOCK_OP_RESPONSE);
    c.reset_transport();
    CHECK(c.empty());
    CHECK(c.event_pending());
    CHECK(c.rx_held(unreadable));  // not even delivered: nothing to read yet

    c.event_delivered(5);
    CHECK_FALSE(c.event_pending());
    CHECK(c.rx_held(avail(5)));  // a notify without a new buffer is no answer
    CHECK(c.rx_held(avail(5)));
    CHECK_FALSE(c.rx_held(avail(6)));  // the driver put the event's buffer back
    CHECK_FALSE(c.rx_held(unreadable));  // and the hold is gone for good

    SUBCASE("a second reset before the first was handled waits for its own event") {
        c.reset_transport();
        c.event_delivered(7);
        c.reset_transport();
        CHECK(c.rx_held(avail(8)));
        c.event_delivered(8);
        CHECK(c.rx_held(avail(8)));
        CHECK_FALSE(c.rx_held(avail(9)));
    }
    SUBCASE("the avail index wraps at 2^16") {
        c.reset_transport();
        c.event_delivered(0xffff);
        CHECK(c.rx_held(avail(0xffff)));
        CHECK_FALSE(c.rx_held(avail(0)));
    }
    SUBCASE("a driver reset forgets the event") {
        c.reset_transport();
        c.push({1, 2}, VIRTIO_VSOCK_OP_RST);
        c.clear();
        CHECK(c.empty());
        CHECK_FALSE(c.event_pending());
        CHECK_FALSE(c.rx_held(unreadable));
    }
}
