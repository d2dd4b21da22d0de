#include <doctest/doctest.h>

#include <linux/virtio_config.h>
#include <linux/virtio_ids.h>
#include <linux/virtio_mmio.h>
#define VIRTIO_RING_NO_LEGACY
#include <linux/virtio_ring.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "devices/virtio_mmio.hpp"
#include "tests/support/mmio_driver.hpp"
#include "core/guest_memory.hpp"
#include "core/layout.hpp"

using namespace agentvm;
using namespace agentvm::test;

namespace {

constexpr uint64_t ram = 16 * layout::mib;
constexpr uint64_t feature_a = 1ull << 0;
constexpr uint64_t offered = feature_a | (1ull << VIRTIO_F_VERSION_1) | (1ull << VIRTIO_RING_F_EVENT_IDX);

// A device that records what the transport asks of it.
class FakeDevice : public VirtioDevice {
public:
    uint32_t device_type() const override { return VIRTIO_ID_BLOCK; }
    uint64_t device_features() const override { return offered; }
    size_t queue_count() const override { return 2; }
    uint16_t queue_max_size(size_t index) const override { return index == 0 ? 16 : 8; }
    void read_config(uint64_t offset, std::span<uint8_t> data) const override
    {
        for (size_t i = 0; i < data.size(); ++i)
            data[i] = offset + i < config.size() ? config[offset + i] : 0;
    }
    void write_config(uint64_t offset, std::span<const uint8_t> data) override
    {
        for (size_t i = 0; i < data.size() && offset + i < config.size(); ++i)
            config[offset + i] = data[i];
    }
    void activate(const VirtioContext& c) override
    {
        ++activations;
        ctx = c;
    }
    void process_queue(size_t index) override { processed.push_back(index); }
    void reset() override
    {
        ++resets;
        ctx = {};
    }

    std::array<uint8_t, 8> config{0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17};
    int activations = 0;
    int resets = 0;
    std::vector<size_t> processed;
    VirtioContext ctx;
};

struct Fixture {
    GuestMemory mem{ram};
    FakeDevice dev;
    int interrupts = 0;
    std::vector<uint16_t> notified;
    VirtioMmioTransport mmio{mem, dev, [this] { ++interrupts; }, [this](uint16_t q) { notified.push_back(q); }};
    MmioDriver regs{mmio};


    void setup_queue(uint32_t index, uint32_t size, uint64_t base)
    {
        regs.wr(VIRTIO_MMIO_QUEUE_SEL, index);
        regs.wr(VIRTIO_MMIO_QUEUE_NUM, size);
        regs.wr(VIRTIO_MMIO_QUEUE_DESC_LOW, static_cast<uint32_t>(base));
        regs.wr(VIRTIO_MMIO_QUEUE_DESC_HIGH, static_cast<uint32_t>(base >> 32));
        regs.wr(VIRTIO_MMIO_QUEUE_AVAIL_LOW, static_cast<uint32_t>(base + 0x1000));
        regs.wr(VIRTIO_MMIO_QUEUE_AVAIL_HIGH, 0);
        regs.wr(VIRTIO_MMIO_QUEUE_USED_LOW, static_cast<uint32_t>(base + 0x2000));
        regs.wr(VIRTIO_MMIO_QUEUE_USED_HIGH, 0);
        regs.wr(VIRTIO_MMIO_QUEUE_READY, 1);
    }
    void driver_ok()
    {
        regs.wr(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK |
                                   VIRTIO_CONFIG_S_DRIVER_OK);
    }
    void bring_up()
    {
        regs.negotiate(offered);
        setup_queue(0, 16, 0x10000);
        setup_queue(1, 8, 0x20000);
        driver_ok();
    }
};

constexpr uint32_t full_status = VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER |
                                 VIRTIO_CONFIG_S_FEATURES_OK | VIRTIO_CONFIG_S_DRIVER_OK;

} // namespace

TEST_CASE_FIXTURE(Fixture, "identification registers")
{
    CHECK(regs.rd(VIRTIO_MMIO_MAGIC_VALUE) == 0x74726976);
    CHECK(regs.rd(VIRTIO_MMIO_VERSION) == 2);
    CHECK(regs.rd(VIRTIO_MMIO_DEVICE_ID) == VIRTIO_ID_BLOCK);
    CHECK(regs.rd(VIRTIO_MMIO_VENDOR_ID) == VirtioMmioTransport::vendor_id);
    CHECK(regs.rd(VIRTIO_MMIO_CONFIG_GENERATION) == 0);
    CHECK(regs.rd(VIRTIO_MMIO_STATUS) == 0);
    CHECK(regs.rd(VIRTIO_MMIO_SHM_LEN_LOW) == 0xffffffff);  // "no shared memory region"
    CHECK(regs.rd(VIRTIO_MMIO_SHM_LEN_HIGH) == 0xffffffff);
    // Write-only, legacy and unknown registers read as zero.
    CHECK(regs.rd(VIRTIO_MMIO_QUEUE_NOTIFY) == 0);
    CHECK(regs.rd(VIRTIO_MMIO_QUEUE_PFN) == 0);
    CHECK(regs.rd(0x0f0) == 0);
}

TEST_CASE_FIXTURE(Fixture, "device features through the select register")
{
    regs.wr(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 0);
    CHECK(regs.rd(VIRTIO_MMIO_DEVICE_FEATURES) == static_cast<uint32_t>(offered));
    regs.wr(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
    CHECK(regs.rd(VIRTIO_MMIO_DEVICE_FEATURES) == static_cast<uint32_t>(offered >> 32));
    CHECK((regs.rd(VIRTIO_MMIO_DEVICE_FEATURES) & 1) == 1);  // VIRTIO_F_VERSION_1 is bit 32
    regs.wr(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 2);
    CHECK(regs.rd(VIRTIO_MMIO_DEVICE_FEATURES) == 0);
}

TEST_CASE_FIXTURE(Fixture, "feature negotiation")
{
    SUBCASE("a subset of the offer is accepted") {
        regs.negotiate((1ull << VIRTIO_F_VERSION_1) | feature_a);
        CHECK((regs.rd(VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_FEATURES_OK) != 0);
        CHECK(mmio.driver_features() == ((1ull << VIRTIO_F_VERSION_1) | feature_a));
        // Frozen once FEATURES_OK is set.
        regs.wr(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
        regs.wr(VIRTIO_MMIO_DRIVER_FEATURES, 0);
        CHECK(mmio.driver_features() == ((1ull << VIRTIO_F_VERSION_1) | feature_a));
    }
    SUBCASE("a feature never offered is refused") {
        regs.negotiate(offered | (1ull << 5));
        CHECK(regs.rd(VIRTIO_MMIO_STATUS) == (VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER));
    }
    SUBCASE("a legacy driver (no VERSION_1) is refused") {
        regs.negotiate(feature_a);
        CHECK((regs.rd(VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_FEATURES_OK) == 0);
        // And so DRIVER_OK cannot follow.
        driver_ok();
        CHECK((regs.rd(VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_DRIVER_OK) == 0);
        CHECK(dev.activations == 0);
    }
}

TEST_CASE_FIXTURE(Fixture, "status state machine")
{
    SUBCASE("bits out of order are dropped") {
        regs.wr(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_DRIVER);
        CHECK(regs.rd(VIRTIO_MMIO_STATUS) == 0);
        regs.wr(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER | VIRTIO_CONFIG_S_DRIVER_OK);
        CHECK(regs.rd(VIRTIO_MMIO_STATUS) == (VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER));
        CHECK(dev.activations == 0);
    }
    SUBCASE("clearing a bit without a reset is ignored") {
        regs.negotiate(offered);
        regs.wr(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE);
        CHECK(regs.rd(VIRTIO_MMIO_STATUS) ==
              (VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK));
    }
    SUBCASE("the driver cannot set NEEDS_RESET or unknown bits") {
        regs.wr(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_NEEDS_RESET);
        CHECK(regs.rd(VIRTIO_MMIO_STATUS) == 0);
        regs.wr(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE | 0x100);
        CHECK(regs.rd(VIRTIO_MMIO_STATUS) == 0);
    }
    SUBCASE("FAILED is recorded") {
        regs.wr(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE);
        regs.wr(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_FAILED);
        CHECK(regs.rd(VIRTIO_MMIO_STATUS) == (VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_FAILED));
    }
}

TEST_CASE_FIXTURE(Fixture, "queue setup and activation")
{
    regs.negotiate(offered);
    regs.wr(VIRTIO_MMIO_QUEUE_SEL, 0);
    CHECK(regs.rd(VIRTIO_MMIO_QUEUE_NUM_MAX) == 16);
    regs.wr(VIRTIO_MMIO_QUEUE_SEL, 1);
    CHECK(regs.rd(VIRTIO_MMIO_QUEUE_NUM_MAX) == 8);
    regs.wr(VIRTIO_MMIO_QUEUE_SEL, 2);
    CHECK(regs.rd(VIRTIO_MMIO_QUEUE_NUM_MAX) == 0);  // no such queue
    CHECK(regs.rd(VIRTIO_MMIO_QUEUE_READY) == 0);
    regs.wr(VIRTIO_MMIO_QUEUE_READY, 1);             // ignored

    SUBCASE("bad size leaves the queue off") {
        setup_queue(0, 12, 0x10000);
        CHECK(regs.rd(VIRTIO_MMIO_QUEUE_READY) == 0);
        setup_queue(0, 32, 0x10000);
        CHECK(regs.rd(VIRTIO_MMIO_QUEUE_READY) == 0);
        setup_queue(0, 0x10010, 0x10000);  // does not fit 16 bits
        CHECK(regs.rd(VIRTIO_MMIO_QUEUE_READY) == 0);
    }
    SUBCASE("rings outside RAM leave the queue off") {
        setup_queue(0, 16, 0x1'0000'0000ull);
        CHECK(regs.rd(VIRTIO_MMIO_QUEUE_READY) == 0);
    }
    SUBCASE("good setup, then DRIVER_OK activates the device") {
        setup_queue(0, 16, 0x10000);
        CHECK(regs.rd(VIRTIO_MMIO_QUEUE_READY) == 1);
        // Configuration of a ready queue is frozen.
        regs.wr(VIRTIO_MMIO_QUEUE_NUM, 4);
        regs.wr(VIRTIO_MMIO_QUEUE_DESC_LOW, 0x50000);
        setup_queue(1, 4, 0x20000);
        driver_ok();
        CHECK(regs.rd(VIRTIO_MMIO_STATUS) == full_status);
        REQUIRE(dev.activations == 1);
        REQUIRE(dev.ctx.queues.size() == 2);
        CHECK(dev.ctx.mem == &mem);
        CHECK(dev.ctx.features == offered);
        const Virtqueue& q0 = dev.ctx.queues[0];
        CHECK(q0.ready());
        CHECK(q0.size() == 16);
        CHECK(q0.desc_addr() == 0x10000);
        CHECK(q0.avail_addr() == 0x11000);
        CHECK(q0.used_addr() == 0x12000);
        CHECK(q0.event_idx());
        CHECK(dev.ctx.queues[1].size() == 4);
        // No queue setup after DRIVER_OK.
        regs.wr(VIRTIO_MMIO_QUEUE_SEL, 1);
        regs.wr(VIRTIO_MMIO_QUEUE_READY, 0);
        CHECK(regs.rd(VIRTIO_MMIO_QUEUE_READY) == 1);
    }
    SUBCASE("without EVENT_IDX negotiated the queues do not use it") {
        regs.wr(VIRTIO_MMIO_STATUS, 0);
        regs.negotiate(1ull << VIRTIO_F_VERSION_1);
        setup_queue(0, 16, 0x10000);
        driver_ok();
        REQUIRE(dev.activations == 1);
        CHECK_FALSE(dev.ctx.queues[0].event_idx());
    }
}

TEST_CASE_FIXTURE(Fixture, "notifications")
{
    SUBCASE("before DRIVER_OK they are ignored") {
        regs.negotiate(offered);
        setup_queue(0, 16, 0x10000);
        regs.wr(VIRTIO_MMIO_QUEUE_NOTIFY, 0);
        CHECK(notified.empty());
    }
    SUBCASE("after DRIVER_OK they reach on_notify") {
        bring_up();
        regs.wr(VIRTIO_MMIO_QUEUE_NOTIFY, 1);
        regs.wr(VIRTIO_MMIO_QUEUE_NOTIFY, 0);
        regs.wr(VIRTIO_MMIO_QUEUE_NOTIFY, 2);  // no such queue
        CHECK(notified == std::vector<uint16_t>{1, 0});
        CHECK(dev.processed.empty());  // on_notify decides where processing runs
        mmio.notify_queue(1);
        mmio.notify_queue(7);
        CHECK(dev.processed == std::vector<size_t>{1});
    }
    SUBCASE("a queue the driver did not enable is not processed") {
        regs.negotiate(offered);
        setup_queue(0, 16, 0x10000);
        driver_ok();
        mmio.notify_queue(1);
        mmio.notify_queue(0);
        CHECK(dev.processed == std::vector<size_t>{0});
    }
}

TEST_CASE_FIXTURE(Fixture, "interrupt status and acknowledgement")
{
    bring_up();
    CHECK(regs.rd(VIRTIO_MMIO_INTERRUPT_STATUS) == 0);
    {
        std::lock_guard lock(dev.mutex());
        dev.ctx.signal_used();
    }
    CHECK(interrupts == 1);
    CHECK(regs.rd(VIRTIO_MMIO_INTERRUPT_STATUS) == VIRTIO_MMIO_INT_VRING);
    regs.wr(VIRTIO_MMIO_INTERRUPT_ACK, VIRTIO_MMIO_INT_VRING);
    CHECK(regs.rd(VIRTIO_MMIO_INTERRUPT_STATUS) == 0);

    // A broken queue: NEEDS_RESET plus a config interrupt; notifications stop.
    {
        std::lock_guard lock(dev.mutex());
        dev.ctx.needs_reset();
    }
    CHECK(interrupts == 2);
    CHECK(regs.rd(VIRTIO_MMIO_INTERRUPT_STATUS) == VIRTIO_MMIO_INT_CONFIG);
    CHECK(regs.rd(VIRTIO_MMIO_STATUS) == (full_status | VIRTIO_CONFIG_S_NEEDS_RESET));
    regs.wr(VIRTIO_MMIO_QUEUE_NOTIFY, 0);
    mmio.notify_queue(0);
    CHECK(notified.empty());
    CHECK(dev.processed.empty());
    // The driver echoing the status back with NEEDS_RESET is fine; a reset clears it.
    regs.wr(VIRTIO_MMIO_STATUS, full_status | VIRTIO_CONFIG_S_NEEDS_RESET);
    CHECK(regs.rd(VIRTIO_MMIO_STATUS) == (full_status | VIRTIO_CONFIG_S_NEEDS_RESET));
    regs.wr(VIRTIO_MMIO_STATUS, 0);
    CHECK(regs.rd(VIRTIO_MMIO_STATUS) == 0);
    CHECK(regs.rd(VIRTIO_MMIO_INTERRUPT_STATUS) == 0);
}

TEST_CASE_FIXTURE(Fixture, "writing 0 to Status resets device and queues")
{
    bring_up();
    regs.wr(VIRTIO_MMIO_QUEUE_SEL, 1);
    regs.wr(VIRTIO_MMIO_STATUS, 0);
    CHECK(dev.resets == 1);
    CHECK(regs.rd(VIRTIO_MMIO_STATUS) == 0);
    CHECK(mmio.driver_features() == 0);
    for (uint32_t q = 0; q < 2; ++q) {
        regs.wr(VIRTIO_MMIO_QUEUE_SEL, q);
        CHECK(regs.rd(VIRTIO_MMIO_QUEUE_READY) == 0);
    }
    const auto s = mmio.save();
    CHECK(s.queue_sel == 1);  // the write after the reset
    CHECK(s.queues[0] == Virtqueue(16).save());
    CHECK(s.queues[1] == Virtqueue(8).save());
    // And the device can be brought up again.
    bring_up();
    CHECK(dev.activations == 2);
}

TEST_CASE_FIXTURE(Fixture, "register accesses of the wrong width are ignored")
{
    regs.negotiate(offered);
    uint16_t half = 0xffff;
    mmio.bus_read(VIRTIO_MMIO_MAGIC_VALUE, std::span(reinterpret_cast<uint8_t*>(&half), 2));
    CHECK(half == 0);
    uint64_t wide = ~0ull;
    mmio.bus_read(VIRTIO_MMIO_MAGIC_VALUE, std::span(reinterpret_cast<uint8_t*>(&wide), 8));
    CHECK(wide == 0);
    const uint8_t zero = 0;
    mmio.bus_write(VIRTIO_MMIO_STATUS, std::span(&zero, 1));  // would be a reset at width 4
    CHECK(dev.resets == 0);
    CHECK((regs.rd(VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_FEATURES_OK) != 0);
    // Unaligned 32-bit access.
    CHECK(regs.rd(VIRTIO_MMIO_MAGIC_VALUE + 1) == 0);
    regs.wr(VIRTIO_MMIO_STATUS + 2, 0);
    CHECK(dev.resets == 0);
}

TEST_CASE_FIXTURE(Fixture, "config space at 0x100 in any width")
{
    uint8_t b = 0;
    mmio.bus_read(VIRTIO_MMIO_CONFIG + 3, std::span(&b, 1));
    CHECK(b == 0x13);
    uint16_t h = 0;
    mmio.bus_read(VIRTIO_MMIO_CONFIG + 1, std::span(reinterpret_cast<uint8_t*>(&h), 2));
    CHECK(h == 0x1211);
    CHECK(regs.rd(VIRTIO_MMIO_CONFIG + 4) == 0x17161514);
    uint64_t q = 0;
    mmio.bus_read(VIRTIO_MMIO_CONFIG, std::span(reinterpret_cast<uint8_t*>(&q), 8));
    CHECK(q == 0x1716151413121110ull);
    CHECK(regs.rd(VIRTIO_MMIO_CONFIG + 0x100) == 0);
    const uint8_t v = 0xaa;
    mmio.bus_write(VIRTIO_MMIO_CONFIG + 2, std::span(&v, 1));
    CHECK(dev.config[2] == 0xaa);
}

TEST_CASE("kernel command-line parameter")
{
    CHECK(virtio_mmio_cmdline_param(layout::virtio_mmio_base, layout::virtio_mmio_size, 5) ==
          "virtio_mmio.device=4K@0xd0000000:5");
    CHECK(virtio_mmio_cmdline_param(0xd0001000, 0x200, 12) == "virtio_mmio.device=512@0xd0001000:12");
}

TEST_CASE("construction refuses a device without VERSION_1")
{
    class Legacy : public FakeDevice {
        uint64_t device_features() const override { return feature_a; }
    };
    GuestMemory mem(ram);
    Legacy dev;
    CHECK_THROWS_AS(VirtioMmioTransport(mem, dev, {}, {}), Error);
}

TEST_CASE_FIXTURE(Fixture, "save, restore, save is identical")
{
    bring_up();
    {
        std::lock_guard lock(dev.mutex());
        dev.ctx.signal_used();
    }
    regs.wr(VIRTIO_MMIO_QUEUE_SEL, 1);
    regs.wr(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
    const auto s = mmio.save();
    CHECK(s.status == full_status);
    CHECK(s.driver_features == offered);
    CHECK(s.interrupt_status == VIRTIO_MMIO_INT_VRING);
    REQUIRE(s.queues.size() == 2);

    GuestMemory mem2(ram);
    FakeDevice dev2;
    VirtioMmioTransport other(mem2, dev2, {}, {});
    other.restore(s);
    CHECK(other.save() == s);
    // DRIVER_OK in the state: the device is live again, with the restored queues.
    CHECK(dev2.activations == 1);
    REQUIRE(dev2.ctx.queues.size() == 2);
    CHECK(dev2.ctx.queues[0].ready());
    CHECK(dev2.ctx.queues[0].event_idx());

    auto bad = s;
    SUBCASE("negotiated features not offered") { bad.driver_features |= 1ull << 7; }
    SUBCASE("queue count mismatch") { bad.queues.pop_back(); }
    SUBCASE("queue too big for the device") { bad.queues[1].size = 16; }
    SUBCASE("DRIVER_OK without FEATURES_OK") { bad.status = VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER_OK; }
    SUBCASE("unknown status bits") { bad.status |= 0x100; }
    SUBCASE("unknown interrupt bits") { bad.interrupt_status |= 4; }
    GuestMemory mem3(ram);
    FakeDevice dev3;
    VirtioMmioTransport third(mem3, dev3, {}, {});
    const auto before = third.save();
    CHECK_THROWS_AS(third.restore(bad), Error);
    CHECK(third.save() == before);
    CHECK(dev3.activations == 0);
}

TEST_CASE("a driver's feature request not yet accepted (no FEATURES_OK) restores as saved")
{
    GuestMemory mem(ram);
    FakeDevice dev;
    VirtioMmioTransport mmio(mem, dev, {}, {});
    VirtioMmioTransport::State s = mmio.save();
    s.status = VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER;
    s.driver_features = ~uint64_t{0};  // more than offered: refused only at FEATURES_OK
    GuestMemory mem2(ram);
    FakeDevice dev2;
    VirtioMmioTransport other(mem2, dev2, {}, {});
    other.restore(s);
    CHECK(other.save() == s);
}
