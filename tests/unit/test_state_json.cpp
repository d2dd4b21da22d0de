// Device states through JSON and CBOR: round trips of states the real devices produced, and
// snapshot bytes that are missing fields, mistyped, out of range, inconsistent, truncated or
// corrupted. A corrupted snapshot may decode to a state a device accepts, or be refused with
// Error; anything else (another exception, a crash, a sanitizer report) is a bug.
#include <doctest/doctest.h>

#include <linux/virtio_blk.h>
#include <linux/virtio_config.h>
#include <linux/virtio_mmio.h>
#include <linux/virtio_vsock.h>
#define VIRTIO_RING_NO_LEGACY
#include <linux/virtio_ring.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "devices/state_json.hpp"
#include "tests/support/disk_image.hpp"
#include "tests/support/mmio_driver.hpp"
#include "common/error.hpp"
#include "core/event_loop.hpp"
#include "core/guest_memory.hpp"
#include "core/layout.hpp"

using namespace agentvm;
using namespace agentvm::test;
using nlohmann::json;

namespace {

constexpr uint64_t ram = 16 * layout::mib;

// --- devices driven a little, as the device tests drive them -----------------------------

Serial::State driven_serial_state()
{
    Serial serial([](uint8_t) {});
    serial.write(uart::lcr, UART_LCR_DLAB);
    serial.write(uart::dll, 1);
    serial.write(uart::dlm, 0);
    serial.write(uart::lcr, 0x03);
    serial.write(uart::fcr, UART_FCR_ENABLE_FIFO);
    serial.write(uart::mcr, UART_MCR_OUT2 | UART_MCR_RTS | UART_MCR_DTR);
    serial.write(uart::scr, 0x42);
    serial.write(uart::ier, UART_IER_RDI | UART_IER_THRI);
    serial.write(uart::thr, 'x');
    for (uint8_t b : {'p', 'q', 'r', 's'})
        serial.enqueue_input(b);
    serial.read(uart::rbr);
    return serial.save();
}

// virtio-blk over a 100-sector copy-on-write disk, one queue at fixed guest addresses.
constexpr uint64_t disk_sectors = 100;  // not a multiple of 64: the bitmap has a tail
constexpr uint64_t blk_desc = 0x10000;
constexpr uint64_t blk_avail = 0x20000;
constexpr uint64_t blk_used = 0x30000;

struct BlkRig {
    TempDir dir;
    std::string base_path = dir.path + "/base.img";
    GuestMemory mem{ram};
    EventLoop loop;
    VirtioBlk blk{make_disk(), loop};
    VirtioMmioTransport mmio{mem, blk, {}, {}};
    MmioDriver regs{mmio};
    uint16_t next_desc = 0;
    uint16_t avail_idx = 0;

    CowDisk make_disk()
    {
        write_bytes(base_path, std::vector<uint8_t>(disk_sectors * CowDisk::sector_size, 0x5a));
        return CowDisk(base_path, dir.path);
    }

    void bring_up()
    {
        regs.negotiate(VirtioBlk::features);
        regs.wr(VIRTIO_MMIO_QUEUE_SEL, 0);
        regs.wr(VIRTIO_MMIO_QUEUE_NUM, VirtioBlk::queue_size);
        regs.wr(VIRTIO_MMIO_QUEUE_DESC_LOW, blk_desc);
        regs.wr(VIRTIO_MMIO_QUEUE_AVAIL_LOW, blk_avail);
        regs.wr(VIRTIO_MMIO_QUEUE_USED_LOW, blk_used);
        regs.wr(VIRTIO_MMIO_QUEUE_READY, 1);
        regs.wr(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK |
                                   VIRTIO_CONFIG_S_DRIVER_OK);
        REQUIRE((regs.rd(VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_DRIVER_OK) != 0);
    }

    // One request (header, one data buffer, status byte), run to completion.
    void request(uint32_t type, uint64_t sector, uint32_t len)
    {
        const uint64_t area = 0x100000 + 0x10000ull * avail_idx;
        virtio_blk_outhdr hdr{};
        hdr.type = type;
        hdr.sector = sector;
        mem.write_obj(area, hdr);
        const bool in = type == VIRTIO_BLK_T_IN;
        const vring_desc chain[] = {
            {area, 16, VRING_DESC_F_NEXT, 0},
            {area + 0x1000, len, static_cast<uint16_t>(VRING_DESC_F_NEXT | (in ? VRING_DESC_F_WRITE : 0)), 0},
            {area + 0x20, 1, VRING_DESC_F_WRITE, 0},
        };
        const uint16_t head = next_desc;
        for (uint16_t i = 0; i < 3; ++i) {
            vring_desc d = chain[i];
            d.next = static_cast<uint16_t>((head + i + 1) % VirtioBlk::queue_size);
            mem.write_obj(blk_desc + 16ull * ((head + i) % VirtioBlk::queue_size), d);
        }
        next_desc = static_cast<uint16_t>((head + 3) % VirtioBlk::queue_size);
        mem.write_obj<uint16_t>(blk_avail + 4 + 2ull * (avail_idx % VirtioBlk::queue_size), head);
        mem.write_obj<uint16_t>(blk_avail + 2, ++avail_idx);
        mmio.notify_queue(0);
        loop.drain();
        REQUIRE(mem.read_obj<uint8_t>(area + 0x20) == VIRTIO_BLK_S_OK);
    }

    // Guest writes sectors 70 and 71, reads one back, and leaves another queue selected.
    void drive()
    {
        bring_up();
        request(VIRTIO_BLK_T_OUT, 70, 1024);
        request(VIRTIO_BLK_T_IN, 70, 512);
        request(VIRTIO_BLK_T_OUT, 3, 512);
        regs.wr(VIRTIO_MMIO_QUEUE_SEL, 1);
        regs.wr(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
        REQUIRE(blk.in_flight() == 0);
    }
};

// virtio-vsock with its three queues; every descriptor slot has its own 4 KiB of guest RAM.
constexpr uint64_t guest_cid = 3;
constexpr uint16_t vsock_qsize = VirtioVsock::queue_size;

struct Backend : VsockBackend {
    std::set<uint32_t> listening;
    bool consume_all = true;

    bool on_connect_request(VsockConnId id) override { return listening.count(id.host_port) != 0; }
    void on_connected(VsockConnId) override {}
    size_t on_data(VsockConnId, std::span<const uint8_t> data) override { return consume_all ? data.size() : 0; }
    void on_shutdown(VsockConnId, uint32_t) override {}
    void on_closed(VsockConnId) override {}
    void on_reset(std::span<const VsockConnId>) override {}
};

virtio_vsock_hdr ghdr(uint16_t op, uint32_t guest_port, uint32_t host_port, uint32_t len = 0, uint32_t fwd_cnt = 0)
{
    virtio_vsock_hdr h{};
    h.src_cid = guest_cid;
    h.dst_cid = vsock_host_cid;
    h.src_port = guest_port;
    h.dst_port = host_port;
    h.len = len;
    h.type = VIRTIO_VSOCK_TYPE_STREAM;
    h.op = op;
    h.buf_alloc = 64 * 1024;
    h.fwd_cnt = fwd_cnt;
    return h;
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed = 0)
{
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i)
        v[i] = static_cast<uint8_t>(i * 7 + seed);
    return v;
}

struct VsockRig {
    GuestMemory mem{ram};
    Backend backend;
    VirtioVsock vsock{backend, guest_cid};
    VirtioMmioTransport mmio{mem, vsock, {}, {}};
    MmioDriver regs{mmio};
    struct Ring {
        uint64_t desc, avail, used;
        uint16_t next_desc = 0;
        uint16_t avail_idx = 0;
    };
    std::array<Ring, 3> rings{{{0x10000, 0x20000, 0x30000}, {0x40000, 0x50000, 0x60000}, {0x70000, 0x80000, 0x90000}}};

    static uint64_t buf(size_t queue, uint16_t idx) { return 0x100000 + (queue * vsock_qsize + idx) * 0x1000ull; }

    void bring_up()
    {
        regs.negotiate(VirtioVsock::features);
        for (uint32_t i = 0; i < 3; ++i) {
            regs.wr(VIRTIO_MMIO_QUEUE_SEL, i);
            regs.wr(VIRTIO_MMIO_QUEUE_NUM, vsock_qsize);
            regs.wr(VIRTIO_MMIO_QUEUE_DESC_LOW, static_cast<uint32_t>(rings[i].desc));
            regs.wr(VIRTIO_MMIO_QUEUE_AVAIL_LOW, static_cast<uint32_t>(rings[i].avail));
            regs.wr(VIRTIO_MMIO_QUEUE_USED_LOW, static_cast<uint32_t>(rings[i].used));
            regs.wr(VIRTIO_MMIO_QUEUE_READY, 1);
        }
        regs.wr(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK |
                                   VIRTIO_CONFIG_S_DRIVER_OK);
        REQUIRE((regs.rd(VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_DRIVER_OK) != 0);
    }

    // A one-descriptor chain on `queue`, published; returns its buffer's address.
    uint64_t add_buffer(size_t queue, uint32_t len, bool writable)
    {
        Ring& r = rings[queue];
        const uint16_t idx = r.next_desc;
        const vring_desc d{buf(queue, idx), len, static_cast<uint16_t>(writable ? VRING_DESC_F_WRITE : 0), 0};
        mem.write_obj(r.desc + 16ull * idx, d);
        r.next_desc = static_cast<uint16_t>((idx + 1) % vsock_qsize);
        mem.write_obj<uint16_t>(r.avail + 4 + 2ull * (r.avail_idx % vsock_qsize), idx);
        mem.write_obj<uint16_t>(r.avail + 2, ++r.avail_idx);
        return d.addr;
    }

    void guest_send(const virtio_vsock_hdr& h, const std::vector<uint8_t>& payload = {})
    {
        std::vector<uint8_t> bytes(vsock_hdr_bytes);
        std::memcpy(bytes.data(), &h, vsock_hdr_bytes);
        bytes.insert(bytes.end(), payload.begin(), payload.end());
        // The address of the slot the next chain takes, before add_buffer publishes it.
        mem.write(buf(VirtioVsock::tx_queue, rings[VirtioVsock::tx_queue].next_desc), bytes);
        add_buffer(VirtioVsock::tx_queue, static_cast<uint32_t>(bytes.size()), false);
        mmio.notify_queue(VirtioVsock::tx_queue);
    }

    void post_rx(int n)
    {
        for (int i = 0; i < n; ++i)
            add_buffer(VirtioVsock::rx_queue, 4096, true);
        mmio.notify_queue(VirtioVsock::rx_queue);
    }

    // One established connection with traffic both ways, data held by the backend, data
    // waiting for rx buffers and a host half-close behind it; one connection we opened that
    // the guest has not answered; replies queued, one from a foreign CID.
    void drive()
    {
        bring_up();
        backend.listening.insert(200);
        guest_send(ghdr(VIRTIO_VSOCK_OP_REQUEST, 100, 200));
        post_rx(2);
        const VsockConnId a{200, 100};
        REQUIRE(vsock.has_connection(a));
        backend.consume_all = false;
        guest_send(ghdr(VIRTIO_VSOCK_OP_RW, 100, 200, 30), pattern(30));
        vsock.consumed(a, 10);
        REQUIRE(vsock.send(a, pattern(5, 1)) == 5);  // goes out in the second rx buffer
        REQUIRE(vsock.send(a, pattern(20, 2)) == 20);  // waits: no rx buffer
        vsock.shutdown(a, VIRTIO_VSOCK_SHUTDOWN_RCV);
        REQUIRE(vsock.connect({50, 60}));
        guest_send(ghdr(VIRTIO_VSOCK_OP_CREDIT_REQUEST, 100, 200, 0, 5));
        guest_send(ghdr(VIRTIO_VSOCK_OP_REQUEST, 101, 300));  // nobody listens: RST
        virtio_vsock_hdr foreign = ghdr(VIRTIO_VSOCK_OP_REQUEST, 102, 400);
        foreign.dst_cid = 7;  // not the host: RST from CID 7
        guest_send(foreign);
    }
};

// --- restoring into a device ---------------------------------------------------------------

struct SerialTarget {
    using State = Serial::State;
    static constexpr std::string_view path = "serial";
    Serial dev{[](uint8_t) {}};
    void restore(const State& s) { dev.restore(s); }
    State save() const { return dev.save(); }
};

struct QueueTarget {
    using State = Virtqueue::State;
    static constexpr std::string_view path = "queue";
    GuestMemory mem{ram};
    Virtqueue queue{VirtioBlk::queue_size};
    void restore(const State& s) { queue.restore(s, mem); }
    State save() const { return queue.save(); }
};

struct TransportTarget {
    using State = VirtioMmioTransport::State;
    static constexpr std::string_view path = "transport";
    BlkRig rig;
    void restore(const State& s) { rig.mmio.restore(s); }
    State save() const { return rig.mmio.save(); }
};

struct BlkTarget {
    using State = VirtioBlk::State;
    static constexpr std::string_view path = "blk";
    BlkRig rig;
    // Any file stands for the snapshot's disk: only the state is under test.
    void restore(const State& s) { rig.blk.restore(s, Fd(::open(rig.base_path.c_str(), O_RDONLY | O_CLOEXEC))); }
    State save() const { return rig.blk.save(); }
};

struct VsockTarget {
    using State = VirtioVsock::State;
    static constexpr std::string_view path = "vsock";
    Backend backend;
    VirtioVsock vsock{backend, 9};
    void restore(const State& s) { vsock.restore(s); }
    State save() const { return vsock.save(); }
};

template <typename Target>
typename Target::State decode(std::span<const uint8_t> bytes)
{
    return state_from_json<typename Target::State>(decode_cbor(bytes), Target::path);
}

// What snapshot bytes become on their way into a device.
enum class Outcome { taken, refused_by_decoding, refused_by_device };

bool starts_with(const std::string& text, const std::string& prefix)
{
    return text.compare(0, prefix.size(), prefix) == 0;
}

// Snapshot bytes all the way into a device, checking that nothing is accepted in part: the
// decoder refuses with an Error naming a CBOR byte or a field of this state, or yields a
// state holding exactly what the bytes say (its JSON is the decoded document, so nothing was
// ignored, defaulted or coerced), which the device either refuses with Error or takes and
// saves back unchanged.
template <typename Target>
Outcome take(Target& target, std::span<const uint8_t> bytes)
{
    json j;
    typename Target::State s;
    try {
        j = decode_cbor(bytes);
        s = state_from_json<typename Target::State>(j, Target::path);
    } catch (const Error& e) {
        const std::string what = e.what();
        INFO("refused with: " << what);
        CHECK((starts_with(what, "snapshot: CBOR: ") || starts_with(what, "snapshot: " + std::string(Target::path))));
        return Outcome::refused_by_decoding;
    }
    const bool exact = json(s) == j;
    INFO("decoded: " << j.dump(-1, ' ', false, json::error_handler_t::replace));
    CHECK(exact);
    try {
        target.restore(s);
    } catch (const Error&) {
        return Outcome::refused_by_device;
    }
    CHECK(target.save() == s);
    return Outcome::taken;
}

// The Error a JSON document gets on its way into the device, or "" when it is accepted.
template <typename Target>
std::string refusal(Target& target, const json& j)
{
    try {
        target.restore(decode<Target>(encode_cbor(j)));
    } catch (const Error& e) {
        return e.what();
    }
    return {};
}

// state -> JSON -> CBOR -> JSON -> state, then into a fresh device and out again.
template <typename Target>
void check_round_trip(const typename Target::State& state)
{
    const json j = state;
    const std::vector<uint8_t> bytes = encode_cbor(j);
    CHECK(decode_cbor(bytes) == j);
    const auto back = decode<Target>(bytes);
    CHECK(back == state);
    Target fresh;
    fresh.restore(back);
    CHECK(fresh.save() == state);
}

// --- generic malformations -----------------------------------------------------------------

struct Site {
    json::json_pointer pointer;
    std::string path;  // as errors name it
    bool member;       // a field of an object (not the root, not an array element)
};

void collect(const json& j, const json::json_pointer& pointer, const std::string& path, bool member,
             std::vector<Site>& out)
{
    out.push_back({pointer, path, member});
    if (j.is_object()) {
        for (auto it = j.begin(); it != j.end(); ++it)
            collect(it.value(), pointer / it.key(), path + "." + it.key(), true, out);
    } else if (j.is_array()) {
        for (size_t i = 0; i < j.size(); ++i)
            collect(j[i], pointer / i, path + "[" + std::to_string(i) + "]", false, out);
    }
}

std::vector<Site> sites(const json& j, std::string_view root)
{
    std::vector<Site> out;
    collect(j, json::json_pointer(), std::string(root), false, out);
    return out;
}

// Every field missing, every value of a wrong type, an unknown field in every object: each is
// refused by decoding, with an Error that names the place.
template <typename Target>
void check_malformed_fields(const typename Target::State& state)
{
    const json good = state;
    const json wrong[] = {nullptr, true, -1, 1.5, "text", json::array(), json::object(), json::binary({1, 2})};
    int cases = 0;
    for (const Site& site : sites(good, Target::path)) {
        const std::string prefix = "snapshot: " + site.path;
        auto expect_refused = [&](const json& j, const std::string& expected) {
            ++cases;
            std::string error;
            try {
                decode<Target>(encode_cbor(j));
            } catch (const Error& e) {
                error = e.what();
            }
            CHECK_MESSAGE(starts_with(error, expected), "expected \"" << expected << "\", got \"" << error << "\"");
        };
        if (site.member) {
            json j = good;
            j[site.pointer.parent_pointer()].erase(site.pointer.back());
            expect_refused(j, prefix + ": missing");
        }
        for (const json& value : wrong) {
            if (value.type() == good[site.pointer].type())
                continue;
            json j = good;
            j[site.pointer] = value;
            expect_refused(j, prefix);
        }
        if (good[site.pointer].is_object()) {
            json j = good;
            j[site.pointer]["bogus"] = 0;
            expect_refused(j, prefix + ": unknown field \"bogus\"");
        }
    }
    CHECK(cases > 10);
}

// Every integer field set to the largest values of wider types: refused with an Error or
// accepted intact, never anything else.
template <typename Target>
void check_large_values(const typename Target::State& state)
{
    const json good = state;
    Target target;
    int cases = 0;
    for (const Site& site : sites(good, Target::path)) {
        if (!good[site.pointer].is_number_unsigned())
            continue;
        for (const uint64_t value : {uint64_t{0xff} + 1, uint64_t{0xffff} + 1, uint64_t{0xffffffff},
                                     uint64_t{0xffffffff} + 1, ~uint64_t{0}}) {
            json j = good;
            j[site.pointer] = value;
            take(target, encode_cbor(j));
            ++cases;
        }
    }
    CHECK(cases > 0);
}

// Every single-bit flip of the encoded state, then random edits: each is refused, or taken
// whole (take()); never a crash, a hang or a state only partly what the bytes say.
template <typename Target>
void check_corruption(const typename Target::State& state)
{
    const std::vector<uint8_t> good = encode_cbor(json(state));
    Target target;
    REQUIRE(take(target, good) == Outcome::taken);

    int counts[3] = {};
    for (size_t pos = 0; pos < good.size(); ++pos) {
        for (int bit = 0; bit < 8; ++bit) {
            std::vector<uint8_t> bytes = good;
            bytes[pos] ^= static_cast<uint8_t>(1u << bit);
            const Outcome outcome = take(target, bytes);
            ++counts[static_cast<int>(outcome)];
            // One flipped bit always changes what the bytes say: a state that decodes to the
            // original one was read past the corruption.
            if (outcome != Outcome::refused_by_decoding) {
                INFO("bit " << bit << " of byte " << pos);
                CHECK_FALSE(state_from_json<typename Target::State>(decode_cbor(bytes), Target::path) == state);
            }
        }
    }
    MESSAGE(Target::path << ": " << good.size() << " bytes; of the bit flips " << counts[0] << " taken, " << counts[1]
                         << " refused by decoding, " << counts[2] << " by the device");

    std::mt19937 rng(12345);
    auto below = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
    for (int round = 0; round < 2000; ++round) {
        std::vector<uint8_t> bytes = good;
        const size_t edits = 1 + below(4);
        for (size_t e = 0; e < edits && !bytes.empty(); ++e) {
            const size_t at = below(bytes.size());
            switch (below(4)) {
            case 0:
                bytes[at] = static_cast<uint8_t>(below(256));
                break;
            case 1:
                bytes.insert(bytes.begin() + static_cast<ptrdiff_t>(at), static_cast<uint8_t>(below(256)));
                break;
            case 2:
                bytes.erase(bytes.begin() + static_cast<ptrdiff_t>(at));
                break;
            default:
                bytes.resize(at);
                break;
            }
        }
        take(target, bytes);
    }

    // Every proper prefix is refused, and so are bytes after the item.
    for (size_t n = 0; n < good.size(); ++n)
        CHECK_THROWS_AS(decode_cbor(std::span(good).first(n)), Error);
    std::vector<uint8_t> longer = good;
    longer.push_back(0);
    CHECK_THROWS_AS(decode_cbor(longer), Error);
}

std::vector<uint8_t> repeated(uint8_t byte, size_t n, std::vector<uint8_t> tail = {})
{
    std::vector<uint8_t> v(n, byte);
    v.insert(v.end(), tail.begin(), tail.end());
    return v;
}

json at(json j, const std::string& pointer, json value)
{
    j[json::json_pointer(pointer)] = std::move(value);
    return j;
}

} // namespace

// --- CBOR --------------------------------------------------------------------------------

TEST_CASE("decode_cbor refuses what encode_cbor never writes, and bounds nesting")
{
    // Deep nesting and nested indefinite-length strings overflow nlohmann's recursive reader
    // (a few hundred KiB are enough); they must be refused before it sees them.
    CHECK_THROWS_AS(decode_cbor(repeated(0x81, 1 << 20, {0})), Error);  // [[[[...]]]]
    CHECK_THROWS_AS(decode_cbor(repeated(0x7f, 1 << 20)), Error);       // indefinite text in text
    CHECK_THROWS_AS(decode_cbor(repeated(0x5f, 1 << 20)), Error);       // indefinite bytes in bytes
    CHECK_THROWS_AS(decode_cbor(repeated(0xa1, 1 << 20)), Error);       // a map as a key
    CHECK_THROWS_AS(decode_cbor(repeated(0xc6, 1 << 20, {0})), Error);  // tags on tags

    // cbor_max_depth levels are fine; one more is not.
    CHECK(decode_cbor(repeated(0x81, cbor_max_depth, {0})).is_array());
    CHECK_THROWS_AS(decode_cbor(repeated(0x81, cbor_max_depth + 1, {0})), Error);
    CHECK(decode_cbor(repeated(0x80, 1)) == json::array());

    // Lengths claiming more than there is are refused before anything is allocated.
    CHECK_THROWS_AS(decode_cbor(std::vector<uint8_t>{0x9b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}), Error);
    CHECK_THROWS_AS(decode_cbor(std::vector<uint8_t>{0xbb, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}), Error);
    CHECK_THROWS_AS(decode_cbor(std::vector<uint8_t>{0x5b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}), Error);
    CHECK_THROWS_AS(decode_cbor(std::vector<uint8_t>{0x7a, 0xff, 0xff, 0xff, 0xff}), Error);
    CHECK_THROWS_AS(decode_cbor(std::vector<uint8_t>{0x42, 0x01}), Error);

    // Integers and lengths in their shortest form only; floats keep their width.
    CHECK(decode_cbor(std::vector<uint8_t>{0x18, 24}) == 24);
    CHECK_THROWS_WITH_AS(decode_cbor(std::vector<uint8_t>{0x18, 23}),
                         "snapshot: CBOR: at byte 0: 23 is not in its shortest form", Error);
    CHECK(decode_cbor(std::vector<uint8_t>{0x19, 0x01, 0x00}) == 256);
    CHECK_THROWS_AS(decode_cbor(std::vector<uint8_t>{0x19, 0x00, 0xff}), Error);
    CHECK(decode_cbor(std::vector<uint8_t>{0x1a, 0x00, 0x01, 0x00, 0x00}) == 65536);
    CHECK_THROWS_AS(decode_cbor(std::vector<uint8_t>{0x1a, 0x00, 0x00, 0xff, 0xff}), Error);
    CHECK(decode_cbor(std::vector<uint8_t>{0x1b, 0, 0, 0, 1, 0, 0, 0, 0}) == uint64_t{1} << 32);
    CHECK_THROWS_AS(decode_cbor(std::vector<uint8_t>{0x1b, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}), Error);
    CHECK_THROWS_AS(decode_cbor(std::vector<uint8_t>{0x38, 0x00}), Error);              // -1, long form
    CHECK_THROWS_AS(decode_cbor(std::vector<uint8_t>{0x58, 0x01, 0x00}), Error);        // bytes of length 1
    CHECK_THROWS_AS(decode_cbor(std::vector<uint8_t>{0x98, 0x01, 0x00}), Error);        // array of 1
    CHECK(decode_cbor(std::vector<uint8_t>{0xfa, 0x3f, 0xc0, 0x00, 0x00}) == 1.5);      // single-width 1.5
    for (const json& j : {json(23), json(24), json(255), json(256), json(65535), json(65536), json(-25),
                          json(uint64_t{1} << 32), json(std::string(300, 'x'))})
        CHECK(decode_cbor(encode_cbor(j)) == j);

    // Map keys: text, once.
    CHECK(decode_cbor(std::vector<uint8_t>{0xa2, 0x61, 'a', 0x01, 0x61, 'b', 0x02}) == json{{"a", 1}, {"b", 2}});
    CHECK_THROWS_WITH_AS(decode_cbor(std::vector<uint8_t>{0xa2, 0x61, 'a', 0x01, 0x61, 'a', 0x02}),
                         "snapshot: CBOR: at byte 4: duplicate key \"a\"", Error);
    CHECK_THROWS_AS(decode_cbor(std::vector<uint8_t>{0xa1, 0x01, 0x02}), Error);
    CHECK_THROWS_AS(decode_cbor(std::vector<uint8_t>{0xa1, 0x41, 'a', 0x02}), Error);

    // No tags, indefinite lengths, undefined or other simple values, stray breaks.
    CHECK_THROWS_AS(decode_cbor(std::vector<uint8_t>{0xc2, 0x41, 0x01}), Error);  // a bignum
    CHECK_THROWS_AS(decode_cbor(std::vector<uint8_t>{0x9f, 0x01, 0xff}), Error);
    CHECK_THROWS_AS(decode_cbor(std::vector<uint8_t>{0xf7}), Error);
    CHECK_THROWS_AS(decode_cbor(std::vector<uint8_t>{0xf8, 0x20}), Error);
    CHECK_THROWS_AS(decode_cbor(std::vector<uint8_t>{0xff}), Error);
    CHECK_THROWS_AS(decode_cbor(std::vector<uint8_t>{0x1c}), Error);
    CHECK_THROWS_AS(decode_cbor(std::vector<uint8_t>{}), Error);
    CHECK_THROWS_AS(decode_cbor(std::vector<uint8_t>{0x01, 0x01}), Error);

    // What encode_cbor writes comes back.
    const json sample = {{"n", 1}, {"big", ~uint64_t{0}}, {"neg", -5}, {"f", 0.5}, {"t", true}, {"z", nullptr},
                         {"s", "text"}, {"b", json::binary({1, 2, 3})}, {"a", json::array({1, json::object()})}};
    CHECK(decode_cbor(encode_cbor(sample)) == sample);
}

// --- serial ------------------------------------------------------------------------------

TEST_CASE("serial state: round trip, malformed fields, bad values, corruption")
{
    const Serial::State state = driven_serial_state();
    REQUIRE(state.rx_fifo.size() == 3);
    check_round_trip<SerialTarget>(state);
    check_malformed_fields<SerialTarget>(state);
    check_large_values<SerialTarget>(state);
    check_corruption<SerialTarget>(state);

    const json good = state;
    SerialTarget t;
    CHECK(refusal(t, at(good, "/ier", 256)) == "snapshot: serial.ier: 256 is out of range 0..255");
    CHECK(refusal(t, at(good, "/rx_fifo", json::array({1, 2}))) ==
          "snapshot: serial.rx_fifo: expected a byte string, got an array");
    // In CBOR a subtype is a tag, which decode_cbor() refuses; JSON built in memory may have one.
    CHECK_THROWS_WITH_AS(state_from_json<Serial::State>(at(good, "/rx_fifo", json::binary({1, 2}, 7)), "serial"),
                         "snapshot: serial.rx_fifo: a byte string with a subtype, which snapshots do not use", Error);
    // restore() checks these itself.
    CHECK_FALSE(refusal(t, at(good, "/ier", 0x10)).empty());
    CHECK_FALSE(refusal(t, at(good, "/mcr", 0x20)).empty());
    CHECK_FALSE(refusal(t, at(good, "/rx_fifo", json::binary(std::vector<uint8_t>(Serial::fifo_capacity + 1)))).empty());
    CHECK(refusal(t, at(good, "/rx_fifo", json::binary(std::vector<uint8_t>(Serial::fifo_capacity)))).empty());
}

// --- virtqueue, virtio-mmio transport, virtio-blk, copy-on-write disk ----------------------

namespace {

VirtioMmioTransport::State driven_transport_state()
{
    BlkRig rig;
    rig.drive();
    return rig.mmio.save();
}

} // namespace

TEST_CASE("virtqueue state: round trip, malformed fields, bad values, corruption")
{
    const auto queue = driven_transport_state().queues.at(0);
    REQUIRE(queue.ready);
    REQUIRE(queue.next_used == 3);

    check_round_trip<QueueTarget>(queue);
    check_malformed_fields<QueueTarget>(queue);
    check_large_values<QueueTarget>(queue);
    check_corruption<QueueTarget>(queue);

    const json good = queue;
    QueueTarget t;
    CHECK(refusal(t, at(good, "/size", 65536)) == "snapshot: queue.size: 65536 is out of range 0..65535");
    CHECK(starts_with(refusal(t, at(good, "/next_avail", 4)), "snapshot: queue.next_used: 1 chains in flight"));
    CHECK(starts_with(refusal(t, at(good, "/ready", false)), "snapshot: queue: a queue that is not ready"));
    CHECK(refusal(t, at(at(at(at(good, "/ready", false), "/next_avail", 0), "/next_used", 0), "/signalled_used", 0))
              .empty());
    // restore() checks these itself.
    CHECK_FALSE(refusal(t, at(good, "/size", 100)).empty());
    CHECK_FALSE(refusal(t, at(good, "/size", 512)).empty());  // above the queue's maximum
    CHECK_FALSE(refusal(t, at(good, "/desc_addr", ram)).empty());
    CHECK_FALSE(refusal(t, at(good, "/used_addr", blk_used + 2)).empty());
}

TEST_CASE("virtio-mmio transport state: round trip, malformed fields, bad values, corruption")
{
    const auto state = driven_transport_state();
    REQUIRE(state.queues.size() == 1);
    REQUIRE(state.queues[0].event_idx);

    check_round_trip<TransportTarget>(state);
    check_malformed_fields<TransportTarget>(state);
    check_large_values<TransportTarget>(state);
    check_corruption<TransportTarget>(state);

    const json good = state;
    TransportTarget t;
    const uint32_t ok = VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK |
                        VIRTIO_CONFIG_S_DRIVER_OK;
    REQUIRE(state.status == ok);
    CHECK(refusal(t, at(good, "/status", ok & ~VIRTIO_CONFIG_S_ACKNOWLEDGE)) ==
          "snapshot: transport.status: 0xe has DRIVER without ACKNOWLEDGE");
    CHECK(refusal(t, at(good, "/status", ok & ~VIRTIO_CONFIG_S_DRIVER)) ==
          "snapshot: transport.status: 0xd has FEATURES_OK without DRIVER");
    CHECK(refusal(t, at(good, "/status", VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER |
                                             VIRTIO_CONFIG_S_FEATURES_OK | VIRTIO_CONFIG_S_NEEDS_RESET)) ==
          "snapshot: transport.status: 0x4b has DEVICE_NEEDS_RESET without DRIVER_OK");
    REQUIRE(state.interrupt_status == VIRTIO_MMIO_INT_VRING);
    const json not_live = at(at(good, "/status", ok & ~VIRTIO_CONFIG_S_DRIVER_OK), "/interrupt_status", 0);
    CHECK(refusal(t, at(not_live, "/interrupt_status", 1)) == "snapshot: transport.interrupt_status: 0x1 before DRIVER_OK");
    CHECK(starts_with(refusal(t, not_live), "snapshot: transport.queues[0].event_idx: on, yet"));
    CHECK(refusal(t, at(not_live, "/queues/0/event_idx", false)) ==
          "snapshot: transport.queues[0]: ring indices moved before DRIVER_OK");
    CHECK(starts_with(refusal(t, at(good, "/queues/0/event_idx", false)),
                      "snapshot: transport.queues[0].event_idx: off, yet VIRTIO_RING_F_EVENT_IDX was negotiated"));
    CHECK(starts_with(
        refusal(t, at(good, "/driver_features", state.driver_features & ~(1ull << VIRTIO_RING_F_EVENT_IDX))),
        "snapshot: transport.queues[0].event_idx: on, yet"));
    CHECK(starts_with(refusal(t, at(good, "/status", 1ull << 32)), "snapshot: transport.status: 4294967296"));
    CHECK(refusal(t, at(good, "/queues", json::object())) ==
          "snapshot: transport.queues: expected an array, got an object");
    // restore() checks these itself.
    CHECK_FALSE(refusal(t, at(good, "/driver_features", state.driver_features | (1ull << 40))).empty());
    CHECK_FALSE(refusal(t, at(good, "/status", ok | 0x100)).empty());
    CHECK_FALSE(refusal(t, at(good, "/status", ok & ~VIRTIO_CONFIG_S_FEATURES_OK)).empty());
    CHECK_FALSE(refusal(t, at(good, "/interrupt_status", 4)).empty());
    json two_queues = good;
    two_queues["queues"].push_back(good["queues"][0]);
    CHECK_FALSE(refusal(t, two_queues).empty());
}

TEST_CASE("virtio-blk state: round trip, malformed fields, bad values, corruption")
{
    BlkRig rig;
    rig.drive();
    const auto state = rig.blk.save();
    REQUIRE(state.disk.written == std::vector<uint64_t>{1ull << 3, 3ull << 6});

    check_round_trip<BlkTarget>(state);
    check_malformed_fields<BlkTarget>(state);
    check_large_values<BlkTarget>(state);
    check_corruption<BlkTarget>(state);

    const json good = state;
    BlkTarget t;
    // The bitmap is stored as runs of written sectors.
    CHECK(good["disk"]["written"] == json::parse("[[3,1],[70,2]]"));
    CHECK(refusal(t, at(good, "/disk/written/0", -1)) ==
          "snapshot: blk.disk.written[0]: expected a [first sector, count] pair, got an integer");
    CHECK(refusal(t, at(good, "/disk/written/1", json::array({70, 0.5}))) ==
          "snapshot: blk.disk.written[1][1]: expected an unsigned integer, got a floating-point number");
    CHECK(refusal(t, at(good, "/disk/written", json::parse("[[3,1],[3,2]]"))) ==
          "snapshot: blk.disk.written[1]: sectors [3, +2) are empty, out of order or past the disk's 100");
    CHECK_FALSE(refusal(t, at(good, "/disk/written", json::parse("[[99,2]]"))).empty());  // past sector 99
    CHECK_FALSE(refusal(t, at(good, "/disk/written", json::parse("[[5,0]]"))).empty());
    CHECK(refusal(t, at(good, "/disk/capacity_sectors", 1ull << 40)) ==
          "snapshot: blk.disk.capacity_sectors: 1099511627776 sectors, more than the 256 GiB a snapshot's disk may have");
    // restore() checks the capacity against the disk itself.
    CHECK_FALSE(refusal(t, at(good, "/disk/capacity_sectors", 128)).empty());
    BlkTarget whole;  // a run over whole bitmap words and a part of one
    CHECK(refusal(whole, at(good, "/disk/written", json::parse("[[0,100]]"))).empty());
    CHECK(whole.save().disk.written == std::vector<uint64_t>{~0ull, (1ull << 36) - 1});
    CHECK(t.save() == BlkRig().blk.save());  // every refusal left the device as it was
}

// --- virtio-vsock ------------------------------------------------------------------------

TEST_CASE("virtio-vsock state: round trip, malformed fields, bad values, corruption")
{
    // Traffic both ways, replies queued, data waiting: none of it is the device's state, which
    // a restore follows with a transport reset.
    VsockRig rig;
    rig.drive();
    const auto state = rig.vsock.save();
    CHECK(state == VirtioVsock::State{guest_cid});

    check_round_trip<VsockTarget>(state);
    check_malformed_fields<VsockTarget>(state);
    check_large_values<VsockTarget>(state);
    check_corruption<VsockTarget>(state);

    // The device's own transport state goes through too, with its three queues.
    const auto mmio_state = rig.mmio.save();
    CHECK(decode<TransportTarget>(encode_cbor(json(mmio_state))) == mmio_state);

    const json good = state;
    VsockTarget t;
    // A state from before snapshot format 5, which kept connections: the manifest's format
    // refuses such a snapshot first, and the state itself is refused all the same.
    CHECK(refusal(t, at(good, "/connections", json::array())) == "snapshot: vsock: unknown field \"connections\"");
    // restore() checks the CID itself.
    CHECK_FALSE(refusal(t, at(good, "/guest_cid", 2)).empty());
    CHECK_FALSE(refusal(t, at(good, "/guest_cid", 0xffffffffull)).empty());
    CHECK(t.save() == VirtioVsock::State{9});  // every refusal left the device as it was
}
