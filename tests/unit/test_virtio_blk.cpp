#include <doctest/doctest.h>

#include <linux/virtio_blk.h>
#include <linux/virtio_config.h>
#include <linux/virtio_ids.h>
#include <linux/virtio_mmio.h>
#define VIRTIO_RING_NO_LEGACY
#include <linux/virtio_ring.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "devices/virtio_blk.hpp"
#include "devices/virtio_mmio.hpp"
#include "tests/support/mmio_driver.hpp"
#include "tests/support/disk_image.hpp"
#include "core/event_loop.hpp"
#include "core/guest_memory.hpp"
#include "core/layout.hpp"

using namespace agentvm;
using namespace agentvm::test;

namespace {

constexpr uint64_t ram = 16 * layout::mib;
constexpr uint64_t sectors = 100;
constexpr uint64_t desc_gpa = 0x10000;
constexpr uint64_t avail_gpa = 0x20000;
constexpr uint64_t used_gpa = 0x30000;
constexpr uint16_t qsize = VirtioBlk::queue_size;

std::string make_base(const TempDir& dir, std::vector<uint8_t>* contents = nullptr)
{
    std::vector<uint8_t> bytes;
    for (uint64_t s = 0; s < sectors; ++s) {
        auto v = base_sector(s);
        bytes.insert(bytes.end(), v.begin(), v.end());
    }
    const std::string path = dir.path + "/base.img";
    write_bytes(path, bytes);
    if (contents)
        *contents = bytes;
    return path;
}

void put_header(const GuestMemory& mem, uint64_t gpa, uint32_t type, uint64_t sector)
{
    virtio_blk_outhdr hdr{};
    hdr.type = type;
    hdr.sector = sector;
    mem.write_obj(gpa, hdr);
}

// --- pure parsing -----------------------------------------------------------------------

constexpr uint64_t hdr_gpa = 0x100000;
constexpr uint64_t data_gpa = 0x101000;
constexpr uint64_t status_gpa = 0x110000;

DescriptorChain chain_of(std::vector<Descriptor> d)
{
    return {0, std::move(d)};
}

const Descriptor hdr_desc{hdr_gpa, 16, false};
const Descriptor status_desc{status_gpa, 1, true};

} // namespace

TEST_CASE("parse: well-formed requests")
{
    GuestMemory mem(ram);
    SUBCASE("IN") {
        put_header(mem, hdr_gpa, VIRTIO_BLK_T_IN, 7);
        auto r = parse_blk_request(chain_of({hdr_desc, {data_gpa, 512, true}, {data_gpa + 4096, 1024, true},
                                             status_desc}),
                                   mem, sectors);
        CHECK(r.status == VIRTIO_BLK_S_OK);
        CHECK(r.type == VIRTIO_BLK_T_IN);
        CHECK(r.sector == 7);
        CHECK(r.data_len == 1536);
        CHECK(r.data.size() == 2);
        REQUIRE(r.status_addr);
        CHECK(*r.status_addr == status_gpa);
    }
    SUBCASE("OUT to the last sectors") {
        put_header(mem, hdr_gpa, VIRTIO_BLK_T_OUT, sectors - 2);
        auto r = parse_blk_request(chain_of({hdr_desc, {data_gpa, 1024, false}, status_desc}), mem, sectors);
        CHECK(r.status == VIRTIO_BLK_S_OK);
        CHECK(r.type == VIRTIO_BLK_T_OUT);
        CHECK(r.data_len == 1024);
    }
    SUBCASE("FLUSH") {
        put_header(mem, hdr_gpa, VIRTIO_BLK_T_FLUSH, 0);
        auto r = parse_blk_request(chain_of({hdr_desc, status_desc}), mem, sectors);
        CHECK(r.status == VIRTIO_BLK_S_OK);
        CHECK(r.type == VIRTIO_BLK_T_FLUSH);
    }
    SUBCASE("GET_ID") {
        put_header(mem, hdr_gpa, VIRTIO_BLK_T_GET_ID, 0);
        auto r = parse_blk_request(chain_of({hdr_desc, {data_gpa, VIRTIO_BLK_ID_BYTES, true}, status_desc}), mem,
                                   sectors);
        CHECK(r.status == VIRTIO_BLK_S_OK);
        CHECK(r.data_len == VIRTIO_BLK_ID_BYTES);
    }
    SUBCASE("status byte is the last byte of a longer status descriptor") {
        put_header(mem, hdr_gpa, VIRTIO_BLK_T_FLUSH, 0);
        auto r = parse_blk_request(chain_of({hdr_desc, {status_gpa, 4, true}}), mem, sectors);
        CHECK(r.status == VIRTIO_BLK_S_OK);
        CHECK(*r.status_addr == status_gpa + 3);
    }
    SUBCASE("the header is a copy") {
        put_header(mem, hdr_gpa, VIRTIO_BLK_T_IN, 3);
        auto r = parse_blk_request(chain_of({hdr_desc, {data_gpa, 512, true}, status_desc}), mem, sectors);
        put_header(mem, hdr_gpa, VIRTIO_BLK_T_OUT, 99);
        CHECK(r.type == VIRTIO_BLK_T_IN);
        CHECK(r.sector == 3);
    }
}

TEST_CASE("parse: malformed requests")
{
    GuestMemory mem(ram);
    put_header(mem, hdr_gpa, VIRTIO_BLK_T_IN, 0);
    auto ioerr = [&](std::vector<Descriptor> d) {
        auto r = parse_blk_request(chain_of(std::move(d)), mem, sectors);
        CHECK(r.status == VIRTIO_BLK_S_IOERR);
        CHECK_FALSE(r.error.empty());
        return r;
    };

    SUBCASE("no status descriptor: nothing may be written") {
        auto r = ioerr({hdr_desc, {data_gpa, 512, true}, {status_gpa, 1, false}});
        CHECK_FALSE(r.status_addr);
        r = ioerr({hdr_desc, {data_gpa, 512, true}, {status_gpa, 0, true}});
        CHECK_FALSE(r.status_addr);
        r = ioerr({});
        CHECK_FALSE(r.status_addr);
    }
    SUBCASE("status but no header") {
        auto r = ioerr({status_desc});
        CHECK(r.status_addr);
    }
    SUBCASE("writable header") {
        auto r = ioerr({{hdr_gpa, 16, true}, {data_gpa, 512, true}, status_desc});
        CHECK(r.status_addr);
    }
    SUBCASE("short or merged header") {
        ioerr({{hdr_gpa, 8, false}, {data_gpa, 512, true}, status_desc});
        ioerr({{hdr_gpa, 16 + 512, false}, status_desc});
    }
    SUBCASE("IN into a readable buffer") {
        ioerr({hdr_desc, {data_gpa, 512, true}, {data_gpa + 512, 512, false}, status_desc});
    }
    SUBCASE("OUT from a writable buffer") {
        put_header(mem, hdr_gpa, VIRTIO_BLK_T_OUT, 0);
        ioerr({hdr_desc, {data_gpa, 512, true}, status_desc});
    }
    SUBCASE("length not a multiple of 512") {
        ioerr({hdr_desc, {data_gpa, 500, true}, status_desc});
        put_header(mem, hdr_gpa, VIRTIO_BLK_T_OUT, 0);
        ioerr({hdr_desc, {data_gpa, 512, false}, {data_gpa, 1, false}, status_desc});
    }
    SUBCASE("beyond the disk") {
        put_header(mem, hdr_gpa, VIRTIO_BLK_T_IN, sectors);
        ioerr({hdr_desc, {data_gpa, 512, true}, status_desc});
        put_header(mem, hdr_gpa, VIRTIO_BLK_T_OUT, sectors - 1);
        ioerr({hdr_desc, {data_gpa, 1024, false}, status_desc});
        put_header(mem, hdr_gpa, VIRTIO_BLK_T_IN, ~0ull);  // sector + count overflows
        ioerr({hdr_desc, {data_gpa, 1024, true}, status_desc});
    }
    SUBCASE("too large") {
        put_header(mem, hdr_gpa, VIRTIO_BLK_T_IN, 0);
        std::vector<Descriptor> d{hdr_desc};
        for (int i = 0; i < 5; ++i)
            d.push_back({0, 256u << 20, true});  // 1.25 GiB in total
        d.push_back(status_desc);
        ioerr(d);
    }
    SUBCASE("flush with data") {
        put_header(mem, hdr_gpa, VIRTIO_BLK_T_FLUSH, 0);
        ioerr({hdr_desc, {data_gpa, 512, false}, status_desc});
    }
    SUBCASE("get-id into a readable buffer") {
        put_header(mem, hdr_gpa, VIRTIO_BLK_T_GET_ID, 0);
        ioerr({hdr_desc, {data_gpa, 20, false}, status_desc});
    }
    SUBCASE("unknown types are unsupported, not errors") {
        for (uint32_t type : std::vector<uint32_t>{2, VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_WRITE_ZEROES, 0x80000001u}) {
            put_header(mem, hdr_gpa, type, 0);
            auto r = parse_blk_request(chain_of({hdr_desc, status_desc}), mem, sectors);
            CHECK(r.status == VIRTIO_BLK_S_UNSUPP);
            CHECK(r.status_addr);
        }
    }
}

// --- end to end: registers, rings, event loop, disk --------------------------------------

namespace {

struct Rig {
    TempDir dir;
    TempDir overlays;
    std::vector<uint8_t> base_bytes;
    std::string base_path = make_base(dir, &base_bytes);
    GuestMemory mem{ram};
    EventLoop loop;
    VirtioBlk blk{CowDisk(base_path, overlays.path), loop, "agentvm-root"};
    int interrupts = 0;
    std::vector<uint16_t> kicks;
    VirtioMmioTransport mmio{mem, blk, [this] { ++interrupts; }, [this](uint16_t q) { kicks.push_back(q); }};
    MmioDriver regs{mmio};
    uint16_t next_desc = 0;
    uint16_t avail_idx = 0;
    uint16_t seen_used = 0;


    void bring_up(uint64_t features = VirtioBlk::features)
    {
        regs.negotiate(features);
        regs.wr(VIRTIO_MMIO_QUEUE_SEL, 0);
        REQUIRE(regs.rd(VIRTIO_MMIO_QUEUE_NUM_MAX) == qsize);
        regs.wr(VIRTIO_MMIO_QUEUE_NUM, qsize);
        regs.wr(VIRTIO_MMIO_QUEUE_DESC_LOW, desc_gpa);
        regs.wr(VIRTIO_MMIO_QUEUE_AVAIL_LOW, avail_gpa);
        regs.wr(VIRTIO_MMIO_QUEUE_USED_LOW, used_gpa);
        regs.wr(VIRTIO_MMIO_QUEUE_READY, 1);
        regs.wr(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK |
                                   VIRTIO_CONFIG_S_DRIVER_OK);
        REQUIRE((regs.rd(VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_DRIVER_OK) != 0);
        next_desc = avail_idx = seen_used = 0;
    }

    // Each request gets its own 64 KiB of guest RAM: header, status, then data.
    static uint64_t area(uint16_t head) { return 0x100000 + 0x10000ull * head; }
    static uint64_t status_of(uint16_t head) { return area(head) + 0x20; }
    static uint64_t data_of(uint16_t head) { return area(head) + 0x1000; }

    // Writes a chain: header, `bufs` (offsets into the data area), status; returns the head.
    struct Buf {
        uint64_t offset;
        uint32_t len;
        bool writable;
    };
    uint16_t request(uint32_t type, uint64_t sector, std::vector<Buf> bufs, bool publish_it = true)
    {
        const uint16_t head = next_desc;
        put_header(mem, area(head), type, sector);
        mem.write_obj<uint8_t>(status_of(head), 0xff);
        std::vector<vring_desc> chain;
        chain.push_back({area(head), 16, 0, 0});
        for (const auto& b : bufs)
            chain.push_back({data_of(head) + b.offset, b.len, static_cast<uint16_t>(b.writable ? VRING_DESC_F_WRITE : 0), 0});
        chain.push_back({status_of(head), 1, VRING_DESC_F_WRITE, 0});
        for (size_t i = 0; i < chain.size(); ++i) {
            const auto idx = static_cast<uint16_t>((next_desc + i) % qsize);
            if (i + 1 < chain.size()) {
                chain[i].flags |= VRING_DESC_F_NEXT;
                chain[i].next = static_cast<uint16_t>((idx + 1) % qsize);
            }
            mem.write_obj(desc_gpa + 16ull * idx, chain[i]);
        }
        next_desc = static_cast<uint16_t>((next_desc + chain.size()) % qsize);
        if (publish_it)
            publish(head);
        return head;
    }
    void publish(uint16_t head)
    {
        mem.write_obj<uint16_t>(avail_gpa + 4 + 2ull * (avail_idx % qsize), head);
        mem.write_obj<uint16_t>(avail_gpa + 2, ++avail_idx);
    }
    void kick_and_wait()
    {
        mmio.notify_queue(0);
        loop.drain();
    }
    uint16_t used_idx() const { return mem.read_obj<uint16_t>(used_gpa + 2); }
    vring_used_elem used(uint16_t i) const { return mem.read_obj<vring_used_elem>(used_gpa + 4 + 8ull * (i % qsize)); }
    uint8_t status(uint16_t head) const { return mem.read_obj<uint8_t>(status_of(head)); }
    void set_used_event(uint16_t v) { mem.write_obj<uint16_t>(avail_gpa + 4 + 2ull * qsize, v); }
    std::vector<uint8_t> data(uint16_t head, uint64_t offset, uint64_t len) const
    {
        std::vector<uint8_t> v(len);
        mem.read(data_of(head) + offset, v);
        return v;
    }
    void fill(uint16_t head, uint64_t offset, uint64_t len, uint8_t byte)
    {
        std::vector<uint8_t> v(len, byte);
        mem.write(data_of(head) + offset, v);
    }
    // The next used element, checked to be for `head`; returns its length.
    uint32_t take_used(uint16_t head)
    {
        REQUIRE(used_idx() != seen_used);
        const auto e = used(seen_used++);
        CHECK(e.id == head);
        return e.len;
    }
};

} // namespace

TEST_CASE_FIXTURE(Rig, "identity and config space")
{
    CHECK(regs.rd(VIRTIO_MMIO_DEVICE_ID) == VIRTIO_ID_BLOCK);
    regs.wr(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 0);
    const uint64_t lo = regs.rd(VIRTIO_MMIO_DEVICE_FEATURES);
    regs.wr(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
    const uint64_t hi = regs.rd(VIRTIO_MMIO_DEVICE_FEATURES);
    CHECK(((hi << 32) | lo) == VirtioBlk::features);
    CHECK((VirtioBlk::features & (1ull << VIRTIO_RING_F_INDIRECT_DESC)) == 0);

    uint64_t capacity = 0;
    mmio.bus_read(VIRTIO_MMIO_CONFIG + offsetof(virtio_blk_config, capacity),
                  std::span(reinterpret_cast<uint8_t*>(&capacity), 8));
    CHECK(capacity == sectors);
    CHECK(regs.rd(VIRTIO_MMIO_CONFIG + offsetof(virtio_blk_config, seg_max)) == VirtioBlk::seg_max);
    CHECK(regs.rd(VIRTIO_MMIO_CONFIG + 0x200) == 0);
    // Read-only config: a write changes nothing.
    regs.wr(VIRTIO_MMIO_CONFIG, 5);
    CHECK(regs.rd(VIRTIO_MMIO_CONFIG) == sectors);
}

TEST_CASE_FIXTURE(Rig, "read, write, read back, flush, get-id")
{
    bring_up();

    // Read sectors 4..5 from the base.
    uint16_t h = request(VIRTIO_BLK_T_IN, 4, {{0, 512, true}, {512, 512, true}});
    kick_and_wait();
    CHECK(take_used(h) == 1024 + 1);
    CHECK(status(h) == VIRTIO_BLK_S_OK);
    CHECK(data(h, 0, 512) == base_sector(4));
    CHECK(data(h, 512, 512) == base_sector(5));

    // Write sectors 5..6.
    h = request(VIRTIO_BLK_T_OUT, 5, {{0, 1024, false}});
    fill(h, 0, 1024, 0x5a);
    kick_and_wait();
    CHECK(take_used(h) == 1);
    CHECK(status(h) == VIRTIO_BLK_S_OK);

    // Read 4..7: base, new, new, base.
    h = request(VIRTIO_BLK_T_IN, 4, {{0, 2048, true}});
    kick_and_wait();
    CHECK(take_used(h) == 2048 + 1);
    CHECK(status(h) == VIRTIO_BLK_S_OK);
    CHECK(data(h, 0, 512) == base_sector(4));
    CHECK(data(h, 512, 1024) == std::vector<uint8_t>(1024, 0x5a));
    CHECK(data(h, 1536, 512) == base_sector(7));

    h = request(VIRTIO_BLK_T_FLUSH, 0, {});
    kick_and_wait();
    CHECK(take_used(h) == 1);
    CHECK(status(h) == VIRTIO_BLK_S_OK);

    h = request(VIRTIO_BLK_T_GET_ID, 0, {{0, VIRTIO_BLK_ID_BYTES, true}});
    fill(h, 0, VIRTIO_BLK_ID_BYTES, 0xee);
    kick_and_wait();
    CHECK(take_used(h) == VIRTIO_BLK_ID_BYTES + 1);
    CHECK(status(h) == VIRTIO_BLK_S_OK);
    std::vector<uint8_t> id(VIRTIO_BLK_ID_BYTES, 0);
    std::memcpy(id.data(), "agentvm-root", 12);
    CHECK(data(h, 0, VIRTIO_BLK_ID_BYTES) == id);

    // The base image is untouched; the device raised interrupts; nothing is in flight.
    CHECK(read_bytes(base_path) == base_bytes);
    CHECK(interrupts >= 1);
    CHECK(regs.rd(VIRTIO_MMIO_INTERRUPT_STATUS) == VIRTIO_MMIO_INT_VRING);
    CHECK(blk.in_flight() == 0);
}

TEST_CASE_FIXTURE(Rig, "a batch of requests in one kick")
{
    bring_up();
    std::vector<uint16_t> heads;
    for (uint16_t s = 0; s < 20; ++s) {
        heads.push_back(request(VIRTIO_BLK_T_OUT, s, {{0, 512, false}}));
        fill(heads.back(), 0, 512, static_cast<uint8_t>(s + 1));
    }
    kick_and_wait();
    CHECK(used_idx() == 20);
    for (uint16_t h : heads)
        CHECK(status(h) == VIRTIO_BLK_S_OK);
    seen_used = 20;
    const uint16_t h = request(VIRTIO_BLK_T_IN, 0, {{0, 20 * 512, true}});
    kick_and_wait();
    CHECK(take_used(h) == 20 * 512 + 1);
    for (uint64_t s = 0; s < 20; ++s)
        CHECK(data(h, s * 512, 512) == std::vector<uint8_t>(512, static_cast<uint8_t>(s + 1)));
}

TEST_CASE_FIXTURE(Rig, "bad requests fail without stopping the device")
{
    bring_up();
    uint16_t h = request(VIRTIO_BLK_T_IN, sectors - 1, {{0, 1024, true}});  // runs off the end
    kick_and_wait();
    CHECK(take_used(h) == 1);
    CHECK(status(h) == VIRTIO_BLK_S_IOERR);

    h = request(VIRTIO_BLK_T_OUT, 0, {{0, 100, false}});  // unaligned
    kick_and_wait();
    CHECK(take_used(h) == 1);
    CHECK(status(h) == VIRTIO_BLK_S_IOERR);

    h = request(VIRTIO_BLK_T_DISCARD, 0, {{0, 16, false}});
    kick_and_wait();
    CHECK(take_used(h) == 1);
    CHECK(status(h) == VIRTIO_BLK_S_UNSUPP);

    // A chain whose status descriptor is readable: returned with length 0, nothing written.
    h = request(VIRTIO_BLK_T_IN, 0, {{0, 512, true}}, false);
    auto last = mem.read_obj<vring_desc>(desc_gpa + 16ull * (h + 2));
    last.flags = 0;
    mem.write_obj(desc_gpa + 16ull * (h + 2), last);
    // ...which makes it readable-after-writable: the queue rejects the chain itself.
    publish(h);
    kick_and_wait();
    CHECK(take_used(h) == 0);
    CHECK(status(h) == 0xff);
    CHECK(data(h, 0, 512) == std::vector<uint8_t>(512, 0));

    // A well-formed chain whose status descriptor is readable: no status byte to write, so
    // the chain is returned with length 0 and the guest's bytes are left alone.
    h = request(VIRTIO_BLK_T_FLUSH, 0, {}, false);
    last = mem.read_obj<vring_desc>(desc_gpa + 16ull * (h + 1));
    last.flags = 0;
    mem.write_obj(desc_gpa + 16ull * (h + 1), last);
    publish(h);
    kick_and_wait();
    CHECK(take_used(h) == 0);
    CHECK(status(h) == 0xff);

    // A cyclic chain: returned with length 0.
    h = request(VIRTIO_BLK_T_IN, 0, {{0, 512, true}}, false);
    auto mid = mem.read_obj<vring_desc>(desc_gpa + 16ull * (h + 1));
    mid.flags = VRING_DESC_F_NEXT;  // readable, so only the cycle is wrong
    mid.next = h;
    mem.write_obj(desc_gpa + 16ull * (h + 1), mid);
    auto first = mem.read_obj<vring_desc>(desc_gpa + 16ull * h);
    first.flags = VRING_DESC_F_NEXT;  // header -> data -> header ...
    mem.write_obj(desc_gpa + 16ull * h, first);
    publish(h);
    kick_and_wait();
    CHECK(take_used(h) == 0);

    // And the device still works.
    h = request(VIRTIO_BLK_T_IN, 9, {{0, 512, true}});
    kick_and_wait();
    CHECK(take_used(h) == 513);
    CHECK(status(h) == VIRTIO_BLK_S_OK);
    CHECK(data(h, 0, 512) == base_sector(9));
    CHECK((regs.rd(VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_NEEDS_RESET) == 0);
}

TEST_CASE_FIXTURE(Rig, "a broken ring sets NEEDS_RESET; a reset recovers")
{
    bring_up();
    mem.write_obj<uint16_t>(avail_gpa + 2, qsize + 1);  // more than the queue holds
    const int before = interrupts;
    kick_and_wait();
    CHECK((regs.rd(VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_NEEDS_RESET) != 0);
    CHECK((regs.rd(VIRTIO_MMIO_INTERRUPT_STATUS) & VIRTIO_MMIO_INT_CONFIG) != 0);
    CHECK(interrupts == before + 1);
    CHECK(used_idx() == 0);

    regs.wr(VIRTIO_MMIO_STATUS, 0);
    mem.write_obj<uint16_t>(avail_gpa + 2, 0);
    bring_up();
    const uint16_t h = request(VIRTIO_BLK_T_IN, 1, {{0, 512, true}});
    kick_and_wait();
    CHECK(take_used(h) == 513);
    CHECK(data(h, 0, 512) == base_sector(1));
}

TEST_CASE_FIXTURE(Rig, "a reset waits for reads in flight; nothing touches guest memory or the ring after it")
{
    bring_up();
    fill(0, 0, 512, 0xaa);  // head 0: the request below
    const uint16_t h = request(VIRTIO_BLK_T_IN, 2, {{0, 512, true}});
    mmio.notify_queue(0);  // submitted, not completed
    CHECK(blk.in_flight() == 1);
    CHECK_THROWS_AS(blk.save(), Error);  // not quiesced

    // As in the VMM: a vCPU thread resets while this thread runs the I/O loop.
    size_t in_flight_after_reset = 0;
    std::vector<uint8_t> data_after_reset;
    std::atomic<bool> resetting{false};
    std::thread vcpu([&] {
        resetting = true;
        regs.wr(VIRTIO_MMIO_STATUS, 0);
        in_flight_after_reset = blk.in_flight();
        data_after_reset = data(h, 0, 512);
        loop.stop();
    });
    while (!resetting)
        std::this_thread::yield();
    // Lets the reset start before the read can complete, so that a reset that does not wait
    // shows; a device that waits passes however the threads are scheduled.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    loop.run();
    vcpu.join();
    loop.drain();
    // Whether the read completed before the reset began (and was used) or during it (and
    // was dropped) is the threads' race; either way it was over when the reset returned.
    CHECK(in_flight_after_reset == 0);
    CHECK(data(h, 0, 512) == data_after_reset);
}

TEST_CASE_FIXTURE(Rig, "a stopping VM's reset does not wait for a loop that has stopped")
{
    bring_up();
    const uint16_t h = request(VIRTIO_BLK_T_IN, 2, {{0, 512, true}});
    mmio.notify_queue(0);
    blk.abandon_resets();
    regs.wr(VIRTIO_MMIO_STATUS, 0);  // returns with the read still in flight
    CHECK(blk.in_flight() == 1);
    loop.drain();
    CHECK(blk.in_flight() == 0);
    // Its completion was dropped: the queue and the status byte are as the reset left them.
    CHECK(used_idx() == 0);
    CHECK(status(h) == 0xff);
    CHECK(regs.rd(VIRTIO_MMIO_INTERRUPT_STATUS) == 0);
}

TEST_CASE_FIXTURE(Rig, "event idx suppresses interrupts the driver did not ask for")
{
    bring_up();
    set_used_event(0);
    uint16_t h = request(VIRTIO_BLK_T_FLUSH, 0, {});
    kick_and_wait();
    CHECK(take_used(h) == 1);
    CHECK(interrupts == 1);

    // The driver is busy polling: it asks to be woken only at used entry 10.
    set_used_event(10);
    for (int i = 0; i < 3; ++i) {
        h = request(VIRTIO_BLK_T_IN, 0, {{0, 512, true}});
        kick_and_wait();
        CHECK(take_used(h) == 513);
    }
    CHECK(interrupts == 1);

    // The device asks to be kicked at the next available entry.
    CHECK(mem.read_obj<uint16_t>(used_gpa + 4 + 8ull * qsize) == avail_idx);

    // Without event idx every completion interrupts.
    regs.wr(VIRTIO_MMIO_STATUS, 0);
    mem.write_obj<uint16_t>(avail_gpa + 2, 0);
    mem.write_obj<uint16_t>(used_gpa + 2, 0);
    bring_up(VirtioBlk::features & ~(1ull << VIRTIO_RING_F_EVENT_IDX));
    interrupts = 0;
    for (int i = 0; i < 3; ++i) {
        h = request(VIRTIO_BLK_T_IN, 0, {{0, 512, true}});
        kick_and_wait();
        CHECK(take_used(h) == 513);
    }
    CHECK(interrupts == 3);
}

TEST_CASE_FIXTURE(Rig, "a QueueNotify write reaches on_notify")
{
    bring_up();
    regs.wr(VIRTIO_MMIO_QUEUE_NOTIFY, 0);
    CHECK(kicks == std::vector<uint16_t>{0});
}

TEST_CASE_FIXTURE(Rig, "save, restore, save is identical")
{
    bring_up();
    uint16_t h = request(VIRTIO_BLK_T_OUT, 70, {{0, 1024, false}});
    fill(h, 0, 1024, 0x77);
    kick_and_wait();
    CHECK(status(h) == VIRTIO_BLK_S_OK);

    const auto blk_state = blk.save();
    const auto mmio_state = mmio.save();
    CHECK(blk_state.disk.capacity_sectors == sectors);
    CHECK(blk_state.disk.written[1] == (3ull << 6));

    // A fresh device over the same base, the written sectors in a file of their own (the
    // snapshot's disk), read as its layer.
    TempDir overlays2;
    GuestMemory mem2(ram);
    EventLoop loop2;
    VirtioBlk blk2(CowDisk(base_path, overlays2.path), loop2);
    VirtioMmioTransport mmio2(mem2, blk2, {}, {});
    blk2.restore(blk_state, Fd(::dup(blk.disk().overlay_fd())));
    mmio2.restore(mmio_state);
    CHECK(blk2.save() == blk_state);
    CHECK(mmio2.save() == mmio_state);
    CHECK(blk2.disk().is_written(70));

    // A disk of another size is refused.
    TempDir small;
    std::ofstream(small.path + "/small.img", std::ios::binary) << std::string(512 * 8, '\0');
    VirtioBlk blk3(CowDisk(small.path + "/small.img", small.path), loop2);
    CHECK_THROWS_AS(blk3.restore(blk_state, Fd(::dup(blk.disk().overlay_fd()))), Error);
}
