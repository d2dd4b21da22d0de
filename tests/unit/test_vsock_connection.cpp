// One vsock connection's state machine (devices/vsock_connection.hpp) without a virtqueue:
// credit in both directions across the 32-bit wrap, a guest that reports nonsense, the
// bounded send queue, and shutdowns.
#include <doctest/doctest.h>

#include <linux/virtio_vsock.h>

#include <cstdint>
#include <vector>

#include "devices/vsock_connection.hpp"

using namespace agentvm;

namespace {

using Phase = VsockConnection::Phase;
constexpr uint32_t wrap_soon = 0xffffff00u;  // 256 bytes before the counters wrap

std::vector<uint8_t> pattern(size_t n, uint8_t seed = 0)
{
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i)
        v[i] = static_cast<uint8_t>(i * 7 + seed);
    return v;
}

} // namespace

TEST_CASE("host -> guest: delivery stays within the guest's credit")
{
    VsockConnection c(Phase::established);
    CHECK(c.peer_credit() == 0);  // until the guest says how much it buffers
    const auto data = pattern(3000);
    CHECK(c.enqueue(data) == 3000);
    CHECK_FALSE(c.deliverable());
    c.record_peer_credit(1000, 0);
    CHECK(c.deliverable());
    CHECK(c.take_payload(400) == std::vector<uint8_t>(data.begin(), data.begin() + 400));  // the buffer's room
    CHECK(c.take_payload(10000) == std::vector<uint8_t>(data.begin() + 400, data.begin() + 1000));  // the credit
    CHECK(c.counters().tx_cnt == 1000);
    CHECK(c.peer_credit() == 0);
    CHECK_FALSE(c.deliverable());
    c.record_peer_credit(1000, 1000);  // the guest read it all
    CHECK(c.take_payload(10000).size() == 1000);
    CHECK(c.queued() == 1000);
}

TEST_CASE("host -> guest: tx_cnt and the guest's fwd_cnt wrap at 2^32")
{
    VsockCounters start;
    start.tx_cnt = wrap_soon;
    start.peer_fwd_cnt = wrap_soon;
    start.peer_buf_alloc = 4096;
    VsockConnection c(Phase::established, start);
    CHECK(c.peer_credit() == 4096);
    CHECK(c.enqueue(pattern(1024)) == 1024);
    CHECK(c.take_payload(vsock_max_payload).size() == 1024);
    CHECK(c.counters().tx_cnt == 0x300u);  // wrapped
    CHECK(c.peer_credit() == 4096 - 1024);
    c.record_peer_credit(4096, wrap_soon + 512);  // the guest read half, its count wrapped too
    CHECK(c.peer_credit() == 4096 - 512);
    c.record_peer_credit(4096, 0x300u);
    CHECK(c.peer_credit() == 4096);
}

TEST_CASE("host -> guest: a guest reporting nonsense gets no credit, never a huge one")
{
    VsockConnection c(Phase::established);
    CHECK(c.enqueue(pattern(100)) == 100);
    SUBCASE("fwd_cnt ahead of what we sent") {
        c.record_peer_credit(4096, 50);
        CHECK(c.peer_credit() == 0);
        CHECK_FALSE(c.deliverable());
    }
    SUBCASE("fwd_cnt far behind, beyond buf_alloc") {
        c.record_peer_credit(4096, 0);
        CHECK(c.take_payload(vsock_max_payload).size() == 100);
        c.record_peer_credit(64, 0);  // shrank its buffer below what is in flight
        CHECK(c.peer_credit() == 0);
    }
    SUBCASE("buf_alloc 0") {
        c.record_peer_credit(0, 0);
        CHECK(c.peer_credit() == 0);
    }
    SUBCASE("buf_alloc at its maximum") {
        c.record_peer_credit(0xffffffffu, 0);
        CHECK(c.take_payload(UINT64_MAX).size() == 100);  // capped by what is queued
        CHECK(c.peer_credit() == 0xffffffffu - 100);
    }
}

TEST_CASE("guest -> host: the credit we advertise, across the wrap")
{
    VsockCounters start;
    start.rx_cnt = start.fwd_cnt = start.last_sent_fwd_cnt = 0xffff0000u;
    VsockConnection c(Phase::established, start);
    CHECK(c.accept_rx(200000));
    CHECK(c.counters().rx_cnt == 0xffff0000u + 200000);  // wrapped
    // 62144 bytes of credit are left: one byte more is a protocol violation, counting nothing.
    CHECK_FALSE(c.accept_rx(VsockConnection::buf_alloc - 200000 + 1));
    CHECK(c.counters().rx_cnt == 0xffff0000u + 200000);
    CHECK_FALSE(c.credit_update_due());  // nothing freed yet
    c.forwarded(200000);
    CHECK(c.counters().fwd_cnt == 0xffff0000u + 200000);
    // The guest still thinks 200000 bytes are held: below the threshold, so tell it.
    CHECK(c.credit_update_due());
    CHECK(c.want_credit_update());
    CHECK_FALSE(c.want_credit_update());  // one is queued already
    CHECK(c.advertise(true) == 0xffff0000u + 200000);
    CHECK_FALSE(c.credit_update_due());
    CHECK(c.want_credit_update());  // the last one went out
    // The whole buffer again, and not a byte more.
    CHECK(c.accept_rx(VsockConnection::buf_alloc));
    CHECK_FALSE(c.accept_rx(1));
    CHECK(c.accept_rx(0));
}

TEST_CASE("guest -> host: what the host takes never outruns what arrived")
{
    VsockConnection c(Phase::established);
    CHECK(c.accept_rx(100));
    c.forwarded(1000);
    CHECK(c.counters().fwd_cnt == 100);
    c.forwarded(1);
    CHECK(c.counters().fwd_cnt == 100);
    // A little freed, the guest's view still roomy: no update yet.
    CHECK_FALSE(c.credit_update_due());
}

TEST_CASE("the send queue is bounded, and reports when it drains to half")
{
    VsockConnection c(Phase::established);
    c.record_peer_credit(0xffffffffu, 0);
    const auto big = pattern(VsockConnection::send_queue_cap + 10);
    CHECK(c.enqueue(big) == VsockConnection::send_queue_cap);
    CHECK(c.send_budget() == 0);
    CHECK(c.enqueue(pattern(1)) == 0);
    size_t taken = 0;
    std::vector<uint8_t> out;
    while (c.queued() > VsockConnection::send_queue_cap / 2 + vsock_max_payload) {
        const auto p = c.take_payload(vsock_max_payload);
        out.insert(out.end(), p.begin(), p.end());
        taken += p.size();
        CHECK_FALSE(c.take_send_space());
    }
    while (!c.take_send_space()) {
        const auto p = c.take_payload(vsock_max_payload);
        REQUIRE(!p.empty());
        out.insert(out.end(), p.begin(), p.end());
    }
    CHECK(c.queued() <= VsockConnection::send_queue_cap / 2);
    CHECK_FALSE(c.take_send_space());  // once
    while (c.queued() > 0) {
        const auto p = c.take_payload(vsock_max_payload);
        out.insert(out.end(), p.begin(), p.end());
    }
    CHECK(out == std::vector<uint8_t>(big.begin(), big.begin() + VsockConnection::send_queue_cap));
    // Small sends share chunks and come out in order.
    for (uint8_t i = 0; i < 100; ++i)
        CHECK(c.enqueue(std::vector<uint8_t>{i}) == 1);
    const auto p = c.take_payload(vsock_max_payload);
    REQUIRE(p.size() == 100);
    for (uint8_t i = 0; i < 100; ++i)
        CHECK(p[i] == i);
}

TEST_CASE("a connection still connecting delivers nothing until RESPONSE")
{
    VsockConnection c(Phase::connecting);
    c.record_peer_credit(4096, 0);
    CHECK(c.enqueue(pattern(10)) == 10);
    CHECK_FALSE(c.deliverable());
    c.establish();
    CHECK(c.phase() == Phase::established);
    CHECK(c.deliverable());
}

TEST_CASE("shutdowns")
{
    VsockConnection c(Phase::established);
    c.record_peer_credit(4096, 0);
    SUBCASE("the host's SHUTDOWN goes out after its data, once") {
        CHECK(c.enqueue(pattern(10)) == 10);
        CHECK(c.shut_local(VIRTIO_VSOCK_SHUTDOWN_SEND));
        CHECK_FALSE(c.shut_local(VIRTIO_VSOCK_SHUTDOWN_SEND));  // nothing new
        CHECK_FALSE(c.shut_local(0x4));                         // unknown bits only
        CHECK(c.send_budget() == 0);
        CHECK(c.take_payload(vsock_max_payload).size() == 10);
        CHECK(c.deliverable());
        CHECK(c.take_shutdown() == VIRTIO_VSOCK_SHUTDOWN_SEND);
        CHECK_FALSE(c.deliverable());
        CHECK(c.shut_local(VIRTIO_VSOCK_SHUTDOWN_RCV | 0x4));
        CHECK(c.local_shutdown() == vsock_shutdown_both);
        CHECK(c.host_stopped_reading());
        CHECK(c.deliverable());  // the wider SHUTDOWN goes out too
        CHECK(c.take_shutdown() == vsock_shutdown_both);
    }
    SUBCASE("the guest stops receiving: what waited for it is dropped") {
        CHECK(c.enqueue(pattern(10)) == 10);
        CHECK(c.shut_peer(VIRTIO_VSOCK_SHUTDOWN_RCV | 0xf0) == VIRTIO_VSOCK_SHUTDOWN_RCV);
        CHECK(c.queued() == 0);
        CHECK(c.send_budget() == 0);
        CHECK_FALSE(c.deliverable());
        CHECK_FALSE(c.peer_stopped_sending());
        CHECK(c.shut_peer(VIRTIO_VSOCK_SHUTDOWN_SEND) == VIRTIO_VSOCK_SHUTDOWN_SEND);
        CHECK(c.peer_stopped_sending());
        CHECK(c.peer_shutdown() == vsock_shutdown_both);
    }
    SUBCASE("unknown bits alone change nothing") {
        CHECK(c.shut_peer(0xfffffffcu) == 0);
        CHECK(c.peer_shutdown() == 0);
    }
}
