// Fuzzes virtio-vsock (devices/virtio_vsock.hpp) from the guest's side and the host's:
//  - parse_vsock_packet on every chain of the tx ring, checked against what it promises;
//  - the device itself, set up through virtio-mmio with the input's ring addresses over 16
//    pages of guest RAM the input fills, its tx queue kicked with the guest's packets, rx and
//    event queues kicked, avail->idx moved, while the host side connects, sends, consumes,
//    shuts down, resets and sends a transport reset, and the driver resets the device;
//  - save -> restore -> save into a fresh device and transport, and each saved State through
//    its JSON parser (devices/state_json.hpp), which must accept whatever save() produced.
//
// A guest cannot make the device throw (at worst a connection is reset), so the device part
// catches nothing; anything that escapes, crashes or trips a sanitizer is a finding.
#include <linux/virtio_config.h>
#include <linux/virtio_mmio.h>
// The legacy part of virtio_ring.h (vring_init) is not valid C++; we need none of it.
#define VIRTIO_RING_NO_LEGACY
#include <linux/virtio_ring.h>
#include <linux/virtio_vsock.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "devices/state_json.hpp"
#include "devices/virtio_mmio.hpp"
#include "devices/virtio_vsock.hpp"
#include "tests/fuzz/fuzz_support.hpp"
#include "tests/support/mmio_driver.hpp"
#include "common/error.hpp"
#include "core/guest_memory.hpp"

using namespace agentvm;
using namespace agentvm::fuzz;
using agentvm::test::MmioDriver;

namespace {

constexpr uint64_t ram_bytes = 16 * 4096;
constexpr uint64_t guest_cid = 3;
constexpr size_t op_count = 24;

enum Flags : uint8_t {
    flag_no_event_idx = 1,
    flag_refuse = 2,      // the backend refuses every connection the guest asks for
    flag_hold = 4,        // on_data takes nothing right away; consumed() releases it later
    flag_echo = 8,        // on_data sends the bytes straight back, from inside the callback
    flag_raw_sizes = 16,  // QueueNum as written, not rounded to a power of two
};

enum Op : uint8_t {
    op_kick,            // QueueNotify of queue arg % 3
    op_driver_publish,  // the driver moves avail->idx of queue arg % 3 on
    op_connect,
    op_send,
    op_host_other,      // consumed, shutdown, reset, or a transport reset
    op_write_register,
    op_reset,           // the driver writes Status 0, then sets the device up again
    op_save_restore,    // when arg % 8 == 0, else a kick
};

struct OpBytes {
    uint8_t op;
    uint8_t arg;
    uint32_t value;
};

struct QueueConfig {
    uint16_t num;
    uint64_t desc, avail, used;
};

struct Config {
    uint8_t flags;
    QueueConfig queues[3];
};

Config read_config(Input& in)
{
    Config c{};
    c.flags = in.byte();
    for (auto& q : c.queues) {
        const uint16_t num = in.take<uint16_t>();
        q.num = (c.flags & flag_raw_sizes) ? num : static_cast<uint16_t>(1u << (num % 9));
        q.desc = in.take<uint64_t>();
        q.avail = in.take<uint64_t>();
        q.used = in.take<uint64_t>();
    }
    return c;
}

// A trivial host: accepts or refuses, keeps what it does not take at once, remembers its
// connections so the host-side operations name live ones.
struct Backend : VsockBackend {
    bool refuse = false;
    bool hold = false;
    VirtioVsock* echo_to = nullptr;
    std::map<VsockConnId, size_t> held;  // live connections and the bytes on_data left us

    bool on_connect_request(VsockConnId id) override
    {
        if (refuse)
            return false;
        held[id];
        return true;
    }
    void on_connected(VsockConnId id) override { held[id]; }
    size_t on_data(VsockConnId id, std::span<const uint8_t> data) override
    {
        if (echo_to)
            echo_to->send(id, data);
        if (!hold)
            return data.size();
        held[id] += data.size();
        return 0;
    }
    void on_shutdown(VsockConnId, uint32_t) override {}
    void on_closed(VsockConnId id) override { held.erase(id); }
    void on_reset(std::span<const VsockConnId> ids) override
    {
        for (const VsockConnId id : ids)
            held.erase(id);
    }

    // A live connection when there is one, else the ports the input names.
    VsockConnId pick(uint8_t arg, uint32_t value) const
    {
        if (!held.empty() && !(arg & 0x80)) {
            auto it = held.begin();
            std::advance(it, arg % held.size());
            return it->first;
        }
        return {value & 0xffff, value >> 16};
    }
};

void bring_up(const MmioDriver& regs, const Config& c)
{
    uint64_t features = VirtioVsock::features;
    if (c.flags & flag_no_event_idx)
        features &= ~(1ull << VIRTIO_RING_F_EVENT_IDX);
    regs.negotiate(features);
    for (uint32_t i = 0; i < 3; ++i) {
        const QueueConfig& q = c.queues[i];
        regs.wr(VIRTIO_MMIO_QUEUE_SEL, i);
        regs.wr(VIRTIO_MMIO_QUEUE_NUM, q.num);
        regs.wr(VIRTIO_MMIO_QUEUE_DESC_LOW, static_cast<uint32_t>(q.desc));
        regs.wr(VIRTIO_MMIO_QUEUE_DESC_HIGH, static_cast<uint32_t>(q.desc >> 32));
        regs.wr(VIRTIO_MMIO_QUEUE_AVAIL_LOW, static_cast<uint32_t>(q.avail));
        regs.wr(VIRTIO_MMIO_QUEUE_AVAIL_HIGH, static_cast<uint32_t>(q.avail >> 32));
        regs.wr(VIRTIO_MMIO_QUEUE_USED_LOW, static_cast<uint32_t>(q.used));
        regs.wr(VIRTIO_MMIO_QUEUE_USED_HIGH, static_cast<uint32_t>(q.used >> 32));
        regs.wr(VIRTIO_MMIO_QUEUE_READY, 1);
    }
    regs.wr(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK |
                                    VIRTIO_CONFIG_S_DRIVER_OK);
}

// The pure parser on each chain of the tx ring, through a queue of our own (the device's
// is untouched), against what parse_vsock_packet promises.
void parse_tx_ring(const QueueConfig& tx, const GuestMemory& mem)
{
    Virtqueue q(VirtioVsock::queue_size);
    q.set_size(tx.num);
    q.set_desc_addr(tx.desc);
    q.set_avail_addr(tx.avail);
    q.set_used_addr(tx.used);
    try {
        q.enable(mem);
    } catch (const GuestError&) {
        return;
    }
    for (int i = 0; i < 16; ++i) {
        std::optional<DescriptorChain> chain;
        try {
            chain = q.pop(mem);
        } catch (const ChainError&) {
            continue;
        } catch (const GuestError&) {
            return;
        }
        if (!chain)
            return;
        const VsockPacket pkt = parse_vsock_packet(*chain, mem, guest_cid);
        uint64_t total = 0;
        for (const auto& d : chain->descriptors)
            total += d.len;
        if (pkt.kind != VsockPacket::Kind::ok) {
            check(!pkt.error.empty(), "a refused packet without a reason");
            check(pkt.payload.empty(), "a refused packet with a payload");
            continue;
        }
        const virtio_vsock_hdr& h = pkt.hdr;
        check(h.src_cid == guest_cid && h.dst_cid == vsock_host_cid, "ok packet with foreign CIDs");
        check(h.type == VIRTIO_VSOCK_TYPE_STREAM, "ok packet of another socket type");
        check(h.op >= VIRTIO_VSOCK_OP_REQUEST && h.op <= VIRTIO_VSOCK_OP_CREDIT_REQUEST, "ok packet with unknown op");
        check(h.len <= vsock_max_payload && h.len <= total - vsock_hdr_bytes, "ok packet longer than its chain");
        check(pkt.payload.size() == (h.op == VIRTIO_VSOCK_OP_RW ? h.len : 0u), "payload is not hdr.len bytes");
    }
}

// Whatever save() returns must restore into a fresh device and transport, identically, and
// must pass the snapshot's JSON parsers.
void check_save_restore(const VirtioVsock& vsock, const VirtioMmioTransport& mmio, const GuestMemory& mem)
{
    const VirtioVsock::State vs = vsock.save();
    const VirtioMmioTransport::State ms = mmio.save();
    Backend backend2;
    VirtioVsock vsock2(backend2, guest_cid);
    VirtioMmioTransport mmio2(mem, vsock2, [] {}, [](uint16_t) {});
    try {
        vsock2.restore(vs);
        mmio2.restore(ms);
    } catch (const Error& e) {
        std::fprintf(stderr, "restore refused: %s\n", e.what());
        finding("restore() refused what save() produced");
    }
    check(vsock2.save() == vs, "vsock save -> restore -> save differs");
    check(mmio2.save() == ms, "transport save -> restore -> save differs");
    try {
        check(state_from_json<VirtioVsock::State>(nlohmann::json(vs), "vsock") == vs, "vsock state JSON round trip");
        check(state_from_json<VirtioMmioTransport::State>(nlohmann::json(ms), "transport") == ms,
              "transport state JSON round trip");
    } catch (const Error& e) {
        std::fprintf(stderr, "state_from_json refused: %s\n", e.what());
        finding("state_from_json refused what save() produced");
    }
}

// Seeds: queues of 8; rx at 0x1000/0x1100/0x1200 with buffers at 0x8000 + 0x200 * i, tx at
// 0x1400/0x1500/0x1600 with packets at 0x2000 + 0x100 * i, event at 0x1800/0x1900/0x1a00 with
// its buffers at 0x9000 + 0x10 * i. Only the first 10 KiB are in the seed; the rest is zero.
struct SeedRings {
    std::vector<uint8_t> ram = std::vector<uint8_t>(0x2800, 0);
    uint16_t tx_idx = 0;

    template <typename T>
    void put(uint64_t gpa, const T& value)
    {
        std::memcpy(ram.data() + gpa, &value, sizeof(value));
    }
    void post_writable(uint64_t desc, uint64_t avail, uint64_t buf, uint32_t len, uint16_t count)
    {
        for (uint16_t i = 0; i < count; ++i) {
            put(desc + 16ull * i, vring_desc{buf + uint64_t{len} * i, len, VRING_DESC_F_WRITE, 0});
            put(avail + 4 + 2ull * i, i);
        }
        put(avail + 2, count);
    }
    SeedRings()
    {
        post_writable(0x1000, 0x1100, 0x8000, 0x200, 8);
        post_writable(0x1800, 0x1900, 0x9000, 0x10, 2);
    }
    // One tx packet, the header split from its payload when there is one.
    void send(uint16_t op, uint32_t guest_port, uint32_t host_port, std::vector<uint8_t> payload = {},
              uint32_t flags = 0)
    {
        virtio_vsock_hdr h{};
        h.src_cid = guest_cid;
        h.dst_cid = vsock_host_cid;
        h.src_port = guest_port;
        h.dst_port = host_port;
        h.len = static_cast<uint32_t>(payload.size());
        h.type = VIRTIO_VSOCK_TYPE_STREAM;
        h.op = op;
        h.flags = flags;
        h.buf_alloc = 64 * 1024;
        const uint64_t buf = 0x2000 + 0x100ull * tx_idx;
        put(buf, h);
        std::copy(payload.begin(), payload.end(), ram.begin() + static_cast<ptrdiff_t>(buf + vsock_hdr_bytes));
        const auto head = static_cast<uint16_t>((2 * tx_idx) % 8);
        if (payload.empty()) {
            put(0x1400 + 16ull * head, vring_desc{buf, vsock_hdr_bytes, 0, 0});
        } else {
            put(0x1400 + 16ull * head, vring_desc{buf, vsock_hdr_bytes, VRING_DESC_F_NEXT, static_cast<uint16_t>(head + 1)});
            put(0x1400 + 16ull * (head + 1),
                vring_desc{buf + vsock_hdr_bytes, static_cast<uint32_t>(payload.size()), 0, 0});
        }
        put(0x1500 + 4 + 2ull * (tx_idx % 8), head);
        put(0x1500 + 2, ++tx_idx);
    }
};

std::vector<uint8_t> seed(const SeedRings& rings, std::vector<OpBytes> ops, uint8_t flags = 0)
{
    Builder b;
    b.put(flags);
    for (uint64_t base : {0x1000, 0x1400, 0x1800})
        b.put(uint16_t{3}).put(base).put(base + 0x100).put(base + 0x200);
    ops.resize(op_count, OpBytes{op_kick, VirtioVsock::tx_queue, 0});
    for (const OpBytes& op : ops)
        b.put(op.op).put(op.arg).put(op.value);
    b.append(rings.ram);
    return b.take();
}

Seeds make_seeds()
{
    const std::vector<uint8_t> hello = {'h', 'e', 'l', 'l', 'o'};
    Seeds seeds;
    SeedRings talk;
    talk.send(VIRTIO_VSOCK_OP_REQUEST, 1000, 52);
    talk.send(VIRTIO_VSOCK_OP_RW, 1000, 52, hello);
    talk.send(VIRTIO_VSOCK_OP_CREDIT_REQUEST, 1000, 52);
    talk.send(VIRTIO_VSOCK_OP_SHUTDOWN, 1000, 52, {}, VIRTIO_VSOCK_SHUTDOWN_SEND);
    const std::vector<OpBytes> talk_ops = {
        {op_kick, VirtioVsock::tx_queue, 0},        {op_kick, VirtioVsock::rx_queue, 0},
        {op_send, 0, 3000},                         {op_kick, VirtioVsock::rx_queue, 0},
        {op_host_other, 0, 5},                      {op_connect, 0, 7 | (2000u << 16)},
        {op_save_restore, 0, 0},                    {op_host_other, 1, 3},
        {op_host_other, 3, 0},                      {op_kick, VirtioVsock::event_queue, 0},
        {op_driver_publish, VirtioVsock::event_queue, 0}, {op_kick, VirtioVsock::rx_queue, 0},
        {op_reset, 0, 0},
    };
    seeds.emplace_back("talk", seed(talk, talk_ops));
    seeds.emplace_back("talk-hold-echo", seed(talk, talk_ops, flag_hold | flag_echo));
    seeds.emplace_back("talk-refused", seed(talk, talk_ops, flag_refuse | flag_no_event_idx));

    SeedRings bad;  // another CID, an unknown op, a RW longer than its buffer, SEQPACKET
    bad.send(VIRTIO_VSOCK_OP_RW, 1000, 52, hello);
    bad.send(99, 1000, 52);
    bad.send(VIRTIO_VSOCK_OP_REQUEST, 1001, 52);
    bad.put(0x2000 + 0x100 * 2 + offsetof(virtio_vsock_hdr, type), uint16_t{VIRTIO_VSOCK_TYPE_SEQPACKET});
    bad.put(0x2000 + offsetof(virtio_vsock_hdr, len), uint32_t{4000});
    seeds.emplace_back("malformed", seed(bad, {{op_kick, VirtioVsock::tx_queue, 0}, {op_kick, VirtioVsock::rx_queue, 0},
                                               {op_save_restore, 0, 0}}));
    return seeds;
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***)
{
    write_seeds_if_asked(make_seeds);
    quiet_logs();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
    static const GuestMemory mem(ram_bytes);
    Input in(data, size);
    const Config config = read_config(in);
    std::vector<OpBytes> ops;
    for (size_t i = 0; i < op_count; ++i)
        ops.push_back({in.byte(), in.byte(), in.take<uint32_t>()});
    const auto image = in.bytes(ram_bytes);
    const auto ram = mem.span(0, ram_bytes);
    std::fill(std::copy(image.begin(), image.end(), ram.begin()), ram.end(), uint8_t{0});

    parse_tx_ring(config.queues[VirtioVsock::tx_queue], mem);

    Backend backend;
    backend.refuse = (config.flags & flag_refuse) != 0;
    backend.hold = (config.flags & flag_hold) != 0;
    VirtioVsock vsock(backend, guest_cid);
    if (config.flags & flag_echo)
        backend.echo_to = &vsock;
    std::vector<uint16_t> notified;
    VirtioMmioTransport mmio(mem, vsock, [] {}, [&](uint16_t q) { notified.push_back(q); });
    const MmioDriver regs(mmio);
    bring_up(regs, config);

    for (const OpBytes& op : ops) {
        const VsockConnId id = backend.pick(op.arg, op.value);
        switch (static_cast<Op>(op.op & 7)) {
        case op_kick:
            mmio.notify_queue(op.arg % 3);
            break;
        case op_driver_publish: {
            const uint64_t idx_gpa = config.queues[op.arg % 3].avail + 2;
            if (mem.contains(idx_gpa, 2))
                mem.write_obj<uint16_t>(idx_gpa, static_cast<uint16_t>(mem.read_obj<uint16_t>(idx_gpa) + op.value % 8 + 1));
            break;
        }
        case op_connect:
            if (vsock.connect({op.value & 0xffff, op.value >> 16}))
                backend.held[{op.value & 0xffff, op.value >> 16}];
            break;
        case op_send: {
            // Mostly small; now and then up to 1 MiB, so that a few sends reach send_queue_cap.
            static const std::vector<uint8_t> pattern = [] {
                std::vector<uint8_t> v(1u << 20);
                for (size_t i = 0; i < v.size(); ++i)
                    v[i] = static_cast<uint8_t>(i * 7);
                return v;
            }();
            const auto bytes = std::span(pattern).first(op.value % ((op.arg & 0x40) ? pattern.size() : 8192u));
            const size_t budget = vsock.send_budget(id);
            check(vsock.send(id, bytes) <= std::min(budget, bytes.size()), "send() took more than its budget");
            break;
        }
        case op_host_other:
            switch (op.arg % 4) {
            case 0:
                if (auto it = backend.held.find(id); it != backend.held.end()) {
                    const size_t n = std::min<size_t>(op.value, it->second);
                    it->second -= n;
                    vsock.consumed(id, n);
                }
                break;
            case 1:
                vsock.shutdown(id, op.value & (VIRTIO_VSOCK_SHUTDOWN_RCV | VIRTIO_VSOCK_SHUTDOWN_SEND));
                break;
            case 2:
                vsock.reset(id);
                backend.held.erase(id);
                break;
            case 3:
                vsock.send_transport_reset();
                break;
            }
            break;
        case op_write_register:
            regs.wr(4ull * op.arg, op.value);
            for (const uint16_t q : notified)
                mmio.notify_queue(q);
            notified.clear();
            break;
        case op_reset:
            regs.wr(VIRTIO_MMIO_STATUS, 0);
            bring_up(regs, config);
            break;
        case op_save_restore:
            // Costly (two devices, JSON): one op in 64, not one in 8; otherwise a kick.
            if (op.arg % 8 == 0)
                check_save_restore(vsock, mmio, mem);
            else
                mmio.notify_queue(op.arg % 3);
            break;
        }
    }
    regs.wr(VIRTIO_MMIO_STATUS, 0);
    return 0;
}
