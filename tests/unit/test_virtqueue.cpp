#include <doctest/doctest.h>

#define VIRTIO_RING_NO_LEGACY
#include <linux/virtio_ring.h>

#include <cstdint>
#include <vector>

#include "devices/virtio_blk.hpp"
#include "devices/virtqueue.hpp"
#include "core/guest_memory.hpp"
#include "core/layout.hpp"

using namespace agentvm;

namespace {

constexpr uint64_t ram = 16 * layout::mib;
constexpr uint64_t desc_gpa = 0x10000;
constexpr uint64_t avail_gpa = 0x20000;
constexpr uint64_t used_gpa = 0x30000;

// The driver's side of a split ring, written by hand into guest RAM.
struct DriverRing {
    const GuestMemory& mem;
    uint16_t size;
    uint16_t avail_idx = 0;

    void desc(uint16_t i, uint64_t addr, uint32_t len, uint16_t flags = 0, uint16_t next = 0)
    {
        mem.write_obj(desc_gpa + 16ull * i, vring_desc{addr, len, flags, next});
    }
    void publish(uint16_t head)
    {
        mem.write_obj<uint16_t>(avail_gpa + 4 + 2ull * (avail_idx % size), head);
        mem.write_obj<uint16_t>(avail_gpa + 2, ++avail_idx);
    }
    void set_avail_idx(uint16_t idx) { mem.write_obj<uint16_t>(avail_gpa + 2, avail_idx = idx); }
    void set_avail_flags(uint16_t flags) { mem.write_obj<uint16_t>(avail_gpa, flags); }
    void set_used_event(uint16_t v) { mem.write_obj<uint16_t>(avail_gpa + 4 + 2ull * size, v); }
    uint16_t avail_event() const { return mem.read_obj<uint16_t>(used_gpa + 4 + 8ull * size); }
    uint16_t used_idx() const { return mem.read_obj<uint16_t>(used_gpa + 2); }
    vring_used_elem used(uint16_t i) const { return mem.read_obj<vring_used_elem>(used_gpa + 4 + 8ull * (i % size)); }
};

Virtqueue make_queue(const GuestMemory& mem, uint16_t size, uint16_t max = 256)
{
    Virtqueue q(max);
    q.set_size(size);
    q.set_desc_addr(desc_gpa);
    q.set_avail_addr(avail_gpa);
    q.set_used_addr(used_gpa);
    q.enable(mem);
    return q;
}

// Pops expecting a ChainError; returns its head.
int pop_error_head(Virtqueue& q, const GuestMemory& mem)
{
    try {
        q.pop(mem);
    } catch (const ChainError& e) {
        return e.head();
    }
    return -1;
}

} // namespace

TEST_CASE("max size must be a power of two")
{
    CHECK_THROWS_AS(Virtqueue(0), Error);
    CHECK_THROWS_AS(Virtqueue(100), Error);
    CHECK(Virtqueue(256).size() == 256);
}

TEST_CASE("enable validates size and ring placement")
{
    GuestMemory mem(ram);
    Virtqueue q(256);
    q.set_desc_addr(desc_gpa);
    q.set_avail_addr(avail_gpa);
    q.set_used_addr(used_gpa);

    SUBCASE("good") {
        q.set_size(8);
        q.enable(mem);
        CHECK(q.ready());
    }
    SUBCASE("size not a power of two") {
        q.set_size(12);
        CHECK_THROWS_AS(q.enable(mem), GuestError);
        CHECK_FALSE(q.ready());
    }
    SUBCASE("size zero or above max") {
        q.set_size(0);
        CHECK_THROWS_AS(q.enable(mem), GuestError);
        Virtqueue small(16);
        small.set_size(32);
        CHECK_THROWS_AS(small.enable(mem), GuestError);
    }
    SUBCASE("misaligned rings") {
        q.set_size(8);
        q.set_desc_addr(desc_gpa + 8);
        CHECK_THROWS_AS(q.enable(mem), GuestError);
        q.set_desc_addr(desc_gpa);
        q.set_avail_addr(avail_gpa + 1);
        CHECK_THROWS_AS(q.enable(mem), GuestError);
        q.set_avail_addr(avail_gpa);
        q.set_used_addr(used_gpa + 2);
        CHECK_THROWS_AS(q.enable(mem), GuestError);
        CHECK_FALSE(q.ready());
    }
    SUBCASE("rings leaving RAM") {
        q.set_size(256);
        q.set_desc_addr(ram - 16 * 255);  // one entry short
        CHECK_THROWS_AS(q.enable(mem), GuestError);
        q.set_desc_addr(desc_gpa);
        q.set_used_addr(ram - 4);  // the used ring's tail and avail_event stick out
        CHECK_THROWS_AS(q.enable(mem), GuestError);
        q.set_used_addr(0xfffffffffffffff0ull);
        CHECK_THROWS_AS(q.enable(mem), GuestError);
    }
}

TEST_CASE("pop copies a chain and add_used returns it")
{
    GuestMemory mem(ram);
    Virtqueue q = make_queue(mem, 8);
    DriverRing d{mem, 8};

    CHECK_FALSE(q.pop(mem).has_value());

    d.desc(2, 0x100000, 16, VRING_DESC_F_NEXT, 5);
    d.desc(5, 0x101000, 512, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 7);
    d.desc(7, 0x102000, 1, VRING_DESC_F_WRITE);
    d.publish(2);

    auto chain = q.pop(mem);
    REQUIRE(chain.has_value());
    CHECK(chain->head == 2);
    REQUIRE(chain->descriptors.size() == 3);
    CHECK(chain->descriptors[0] == Descriptor{0x100000, 16, false});
    CHECK(chain->descriptors[1] == Descriptor{0x101000, 512, true});
    CHECK(chain->descriptors[2] == Descriptor{0x102000, 1, true});
    CHECK(q.in_flight() == 1);
    CHECK_FALSE(q.pop(mem).has_value());

    // The copy is ours: the guest rewriting every descriptor of the chain after the pop, into
    // another valid request, changes nothing the device then builds its request from.
    d.desc(2, 0x103000, 16, VRING_DESC_F_NEXT, 5);
    d.desc(5, 0x104000, 1024, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 7);
    d.desc(7, 0x105000, 1, VRING_DESC_F_WRITE);
    mem.write_obj(0x100000, virtio_blk_outhdr{VIRTIO_BLK_T_IN, 0, 3});
    mem.write_obj(0x103000, virtio_blk_outhdr{VIRTIO_BLK_T_IN, 0, 9});  // the rewritten head's
    const BlkRequest req = parse_blk_request(*chain, mem, 1024);
    CHECK(req.status == VIRTIO_BLK_S_OK);
    CHECK(req.type == VIRTIO_BLK_T_IN);
    CHECK(req.sector == 3);
    CHECK(req.data == std::vector<Descriptor>{{0x101000, 512, true}});
    CHECK(req.status_addr == 0x102000);

    q.add_used(mem, 2, 513);
    CHECK(d.used_idx() == 1);
    CHECK(d.used(0).id == 2);
    CHECK(d.used(0).len == 513);
    CHECK(q.in_flight() == 0);
}

TEST_CASE("a not-ready queue yields nothing")
{
    GuestMemory mem(ram);
    Virtqueue q(8);
    DriverRing d{mem, 8};
    d.desc(0, 0x100000, 16);
    d.publish(0);
    CHECK_FALSE(q.pop(mem).has_value());
}

TEST_CASE("used ring and avail ring wrap around the queue size")
{
    GuestMemory mem(ram);
    Virtqueue q = make_queue(mem, 4);
    DriverRing d{mem, 4};
    for (uint16_t i = 0; i < 4; ++i)
        d.desc(i, 0x100000 + 0x1000 * i, 64);
    for (int round = 0; round < 5; ++round) {
        for (uint16_t i = 0; i < 4; ++i)
            d.publish(i);
        for (uint16_t i = 0; i < 4; ++i) {
            auto c = q.pop(mem);
            REQUIRE(c);
            CHECK(c->head == i);
            q.add_used(mem, c->head, i);
        }
        CHECK_FALSE(q.pop(mem));
    }
    CHECK(d.used_idx() == 20);
    CHECK(d.used(19).id == 3);
    CHECK(d.used(19).len == 3);
}

TEST_CASE("a 16-bit index wraps at 65536")
{
    GuestMemory mem(ram);
    Virtqueue q = make_queue(mem, 4);
    Virtqueue::State s = q.save();
    s.next_avail = 0xfffe;
    s.next_used = 0xfffe;
    q.restore(s, mem);
    DriverRing d{mem, 4};
    d.set_avail_idx(0xfffe);
    d.desc(0, 0x100000, 64);
    d.publish(0);
    d.publish(0);
    d.publish(0);
    CHECK(d.avail_idx == 1);
    for (int i = 0; i < 3; ++i) {
        auto c = q.pop(mem);
        REQUIRE(c);
        q.add_used(mem, c->head, 0);
    }
    CHECK_FALSE(q.pop(mem));
    CHECK(d.used_idx() == 1);
}

TEST_CASE("malformed chains throw ChainError with the consumed head")
{
    GuestMemory mem(ram);
    Virtqueue q = make_queue(mem, 8);
    DriverRing d{mem, 8};

    SUBCASE("buffer outside RAM") {
        d.desc(1, ram - 8, 16);
        d.publish(1);
        CHECK(pop_error_head(q, mem) == 1);
    }
    SUBCASE("addr + len overflows") {
        d.desc(1, 0xfffffffffffff000ull, 0x2000);
        d.publish(1);
        CHECK(pop_error_head(q, mem) == 1);
    }
    SUBCASE("buffer inside the MMIO gap of a big guest is not RAM") {
        d.desc(1, layout::mmio_gap_start, 16);
        d.publish(1);
        CHECK(pop_error_head(q, mem) == 1);
    }
    SUBCASE("descriptor pointing at itself") {
        d.desc(3, 0x100000, 16, VRING_DESC_F_NEXT, 3);
        d.publish(3);
        CHECK(pop_error_head(q, mem) == 3);
    }
    SUBCASE("cycle through the whole table is longer than the queue") {
        for (uint16_t i = 0; i < 8; ++i)
            d.desc(i, 0x100000, 16, VRING_DESC_F_NEXT, static_cast<uint16_t>((i + 1) % 8));
        d.publish(4);
        CHECK(pop_error_head(q, mem) == 4);
    }
    SUBCASE("a chain of exactly the queue size is fine") {
        for (uint16_t i = 0; i < 7; ++i)
            d.desc(i, 0x100000, 16, VRING_DESC_F_NEXT, static_cast<uint16_t>(i + 1));
        d.desc(7, 0x100000, 16);
        d.publish(0);
        auto c = q.pop(mem);
        REQUIRE(c);
        CHECK(c->descriptors.size() == 8);
    }
    SUBCASE("next index outside the queue") {
        d.desc(0, 0x100000, 16, VRING_DESC_F_NEXT, 8);
        d.publish(0);
        CHECK(pop_error_head(q, mem) == 0);
    }
    SUBCASE("head index outside the queue") {
        d.publish(200);
        CHECK(pop_error_head(q, mem) == 200);
    }
    SUBCASE("indirect descriptor") {
        d.desc(0, 0x100000, 32, VRING_DESC_F_INDIRECT);
        d.publish(0);
        CHECK(pop_error_head(q, mem) == 0);
    }
    SUBCASE("readable after writable") {
        d.desc(0, 0x100000, 16, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 1);
        d.desc(1, 0x101000, 16);
        d.publish(0);
        CHECK(pop_error_head(q, mem) == 0);
    }
    // Whatever went wrong, the head was consumed and the queue goes on.
    CHECK(q.in_flight() <= 1);
    d.desc(6, 0x100000, 16);
    d.publish(6);
    auto next = q.pop(mem);
    REQUIRE(next);
    CHECK(next->head == 6);
}

TEST_CASE("avail idx moved by more than the queue size breaks the queue")
{
    GuestMemory mem(ram);
    Virtqueue q = make_queue(mem, 8);
    DriverRing d{mem, 8};
    d.set_avail_idx(9);
    CHECK_THROWS_AS(q.pop(mem), GuestError);
    try {
        q.pop(mem);
    } catch (const ChainError&) {
        FAIL("a broken ring is not a chain error");
    } catch (const GuestError&) {
    }
    CHECK(q.in_flight() == 0);  // nothing consumed
    d.set_avail_idx(8);         // exactly the queue size is legal
    d.desc(0, 0x100000, 16);
    CHECK(q.pop(mem).has_value());
}

TEST_CASE("without event idx, VRING_AVAIL_F_NO_INTERRUPT suppresses interrupts")
{
    GuestMemory mem(ram);
    Virtqueue q = make_queue(mem, 8);
    DriverRing d{mem, 8};
    CHECK_FALSE(q.should_notify(mem));  // nothing added
    q.add_used(mem, 0, 0);
    CHECK(q.should_notify(mem));
    CHECK_FALSE(q.should_notify(mem));  // already told
    d.set_avail_flags(VRING_AVAIL_F_NO_INTERRUPT);
    q.add_used(mem, 1, 0);
    CHECK_FALSE(q.should_notify(mem));
}

TEST_CASE("event idx: interrupts only when used idx crosses used_event")
{
    GuestMemory mem(ram);
    Virtqueue q = make_queue(mem, 8);
    q.set_event_idx(true);
    DriverRing d{mem, 8};
    d.set_avail_flags(VRING_AVAIL_F_NO_INTERRUPT);  // ignored with event idx

    d.set_used_event(0);
    q.add_used(mem, 0, 0);  // used 0 -> 1 crosses 0
    CHECK(q.should_notify(mem));
    q.add_used(mem, 1, 0);  // 1 -> 2 does not cross 0 again
    CHECK_FALSE(q.should_notify(mem));

    d.set_used_event(4);  // "wake me once entry 4 is used"
    q.add_used(mem, 2, 0);
    q.add_used(mem, 3, 0);  // 2 -> 4: entries 2, 3
    CHECK_FALSE(q.should_notify(mem));
    q.add_used(mem, 4, 0);  // 4 -> 5: entry 4
    CHECK(q.should_notify(mem));

    // Several entries added between checks are judged together.
    d.set_used_event(6);
    q.add_used(mem, 5, 0);
    q.add_used(mem, 6, 0);
    q.add_used(mem, 7, 0);  // 5 -> 8 covers 6
    CHECK(q.should_notify(mem));
}

TEST_CASE("event idx: an empty ring publishes avail_event")
{
    GuestMemory mem(ram);
    Virtqueue q = make_queue(mem, 8);
    q.set_event_idx(true);
    DriverRing d{mem, 8};
    mem.write_obj<uint16_t>(used_gpa + 4 + 8 * 8, 0xbeef);
    CHECK_FALSE(q.pop(mem));
    CHECK(d.avail_event() == 0);
    d.desc(0, 0x100000, 16);
    d.publish(0);
    d.publish(0);
    CHECK(q.pop(mem));
    CHECK(d.avail_event() == 0);  // not rewritten while work is pending
    CHECK(q.pop(mem));
    CHECK_FALSE(q.pop(mem));
    CHECK(d.avail_event() == 2);  // kick me when entry 2 arrives

    // Without event idx the field is left alone.
    Virtqueue plain = make_queue(mem, 8);
    mem.write_obj<uint16_t>(used_gpa + 4 + 8 * 8, 0xbeef);
    Virtqueue::State s = plain.save();
    s.next_avail = s.next_used = 2;
    plain.restore(s, mem);
    CHECK_FALSE(plain.pop(mem));
    CHECK(d.avail_event() == 0xbeef);
}

TEST_CASE("reset returns to the power-on state")
{
    GuestMemory mem(ram);
    Virtqueue q = make_queue(mem, 8, 64);
    q.set_event_idx(true);
    DriverRing d{mem, 8};
    d.desc(0, 0x100000, 16);
    d.publish(0);
    CHECK(q.pop(mem));
    q.reset();
    CHECK(q.save() == Virtqueue(64).save());
    CHECK(q.size() == 64);
    CHECK_FALSE(q.ready());
}

TEST_CASE("save, restore, save is identical; bad states are refused")
{
    GuestMemory mem(ram);
    Virtqueue q = make_queue(mem, 16);
    q.set_event_idx(true);
    DriverRing d{mem, 16};
    d.desc(0, 0x100000, 16);
    for (int i = 0; i < 5; ++i)
        d.publish(0);
    for (int i = 0; i < 5; ++i)
        CHECK(q.pop(mem));
    for (int i = 0; i < 3; ++i)
        q.add_used(mem, 0, 0);
    d.set_used_event(0);
    q.should_notify(mem);
    const Virtqueue::State s = q.save();
    CHECK(s.next_avail == 5);
    CHECK(s.next_used == 3);
    CHECK(s.signalled_used == 3);

    Virtqueue r(256);
    r.restore(s, mem);
    CHECK(r.save() == s);
    CHECK(r.ready());

    auto bad = s;
    SUBCASE("size not a power of two") { bad.size = 12; }
    SUBCASE("size above max") { bad.size = 512; }
    SUBCASE("more in flight than the queue holds") { bad.next_avail = static_cast<uint16_t>(bad.next_used + 17); }
    SUBCASE("rings outside RAM") { bad.used_addr = ram; }
    Virtqueue t(256);
    const auto before = t.save();
    CHECK_THROWS_AS(t.restore(bad, mem), Error);
    CHECK(t.save() == before);

    // A not-ready queue may carry any addresses (the driver had not finished setting it up).
    auto idle = s;
    idle.ready = false;
    idle.used_addr = ram;
    t.restore(idle, mem);
    CHECK(t.save() == idle);
    // ... and any size it wrote: save() keeps it, so restore() must take it.
    idle.size = 3;
    t.restore(idle, mem);
    CHECK(t.save() == idle);
}
