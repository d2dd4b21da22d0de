// Fuzzes the split virtqueue's device side (devices/virtqueue.hpp): ring placement, descriptor
// walking, used-ring updates, notification suppression and save/restore, over four pages of
// guest RAM whose contents the input supplies.
//
// Input: a fixed header (queue configuration), 32 operation bytes, then the RAM image from
// guest address 0. ChainError and GuestError are the queue refusing what the guest wrote;
// anything else, or a chain that breaks pop()'s documented guarantees, is a finding.
// The legacy part of virtio_ring.h (vring_init) is not valid C++; we need none of it.
#define VIRTIO_RING_NO_LEGACY
#include <linux/virtio_ring.h>

#include <bit>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "devices/virtqueue.hpp"
#include "tests/fuzz/fuzz_support.hpp"
#include "common/error.hpp"
#include "core/guest_memory.hpp"

using namespace agentvm;
using namespace agentvm::fuzz;

namespace {

constexpr uint64_t ram_bytes = 4 * 4096;
constexpr size_t op_count = 32;

enum Flags : uint8_t {
    flag_event_idx = 1,
    flag_restore = 2,   // set the queue up through restore() instead of enable()
    flag_raw_size = 4,  // QueueNum as written, not rounded to a power of two
};

enum Op : uint8_t {
    op_pop,
    op_add_used,
    op_should_notify,
    op_save,            // save() alone, on whatever state the queue is in
    op_driver_publish,  // the driver moves avail->idx on by arg + 1
    op_driver_flags,    // the driver writes avail->flags and used_event
    op_save_restore,
    op_reset,
};

struct Config {
    uint16_t max_size;
    uint8_t flags;
    uint16_t size;
    uint64_t desc, avail, used;
    uint16_t next_avail, next_used, signalled_used;
};

Config read_config(Input& in)
{
    Config c{};
    c.max_size = static_cast<uint16_t>(1u << (in.byte() % 16));
    c.flags = in.byte();
    const uint16_t size = in.take<uint16_t>();
    c.size = (c.flags & flag_raw_size) ? size : static_cast<uint16_t>(1u << (size % 16));
    c.desc = in.take<uint64_t>();
    c.avail = in.take<uint64_t>();
    c.used = in.take<uint64_t>();
    c.next_avail = in.take<uint16_t>();
    c.next_used = in.take<uint16_t>();
    c.signalled_used = in.take<uint16_t>();
    return c;
}

// Returns false when the queue refused the configuration (a clean outcome).
bool set_up(Virtqueue& q, const Config& c, const GuestMemory& mem)
{
    const bool event_idx = (c.flags & flag_event_idx) != 0;
    if (c.flags & flag_restore) {
        const Virtqueue::State s{c.size, true, event_idx, c.desc, c.avail, c.used,
                                 c.next_avail, c.next_used, c.signalled_used};
        try {
            q.restore(s, mem);
        } catch (const Error&) {
            return false;
        }
        check(q.save() == s, "restore() kept a state other than the one it accepted");
        return true;
    }
    q.set_size(c.size);
    q.set_desc_addr(c.desc);
    q.set_avail_addr(c.avail);
    q.set_used_addr(c.used);
    try {
        q.enable(mem);
    } catch (const GuestError&) {
        check(!q.ready(), "enable() threw but left the queue ready");
        return false;
    }
    q.set_event_idx(event_idx);
    return true;
}

// What pop() promises about a chain it returns (virtqueue.hpp).
void check_chain(const DescriptorChain& chain, const Virtqueue& q, const GuestMemory& mem)
{
    check(chain.head < q.size(), "chain head outside the queue");
    check(!chain.descriptors.empty(), "empty chain");
    check(chain.descriptors.size() <= q.size(), "chain longer than the queue");
    bool seen_writable = false;
    for (const Descriptor& d : chain.descriptors) {
        check(mem.contains(d.addr, d.len), "descriptor buffer outside RAM");
        check(!seen_writable || d.writable, "readable descriptor after a writable one");
        seen_writable = d.writable;
    }
}

// The driver's own writes to its rings: plain guest RAM writes, wherever the rings claim to be.
void driver_write_u16(const GuestMemory& mem, uint64_t gpa, uint16_t value)
{
    if (mem.contains(gpa, sizeof(value)))
        mem.write_obj(gpa, value);
}

// A ring of 8 at 0x1000/0x2000/0x3000 holding six chains: a two-part request, a single
// buffer, a cycle, an indirect descriptor, a buffer leaving RAM and a lone writable byte.
std::vector<uint8_t> good_ring_image()
{
    std::vector<uint8_t> ram(0x3000 + Virtqueue::used_ring_bytes(8), 0);
    auto put = [&](uint64_t gpa, const auto& value) {
        std::memcpy(ram.data() + gpa, &value, sizeof(value));
    };
    const vring_desc descs[8] = {
        {0x3400, 16, VRING_DESC_F_NEXT, 1},
        {0x3500, 512, VRING_DESC_F_WRITE, 0},
        {0x3600, 64, 0, 0},
        {0x3700, 8, VRING_DESC_F_NEXT, 4},
        {0x3708, 8, VRING_DESC_F_NEXT, 3},
        {0x3800, 16, VRING_DESC_F_INDIRECT, 0},
        {0x3f00, 0x200, 0, 0},
        {0x3900, 1, VRING_DESC_F_WRITE, 0},
    };
    for (uint16_t i = 0; i < 8; ++i)
        put(0x1000 + 16u * i, descs[i]);
    const uint16_t heads[] = {0, 2, 3, 5, 6, 7};
    for (uint16_t i = 0; i < 6; ++i)
        put(0x2000 + 4 + 2u * i, heads[i]);
    put(0x2002, uint16_t{6});                      // avail->idx
    put(0x2000 + 4 + 2 * 8, uint16_t{2});          // used_event
    return ram;
}

Seeds make_seeds()
{
    Seeds seeds;
    const auto ram = good_ring_image();
    auto seed = [&](uint8_t flags, uint16_t size_field, std::vector<uint8_t> ops, uint16_t next_avail = 0) {
        Builder b;
        b.put(uint8_t{8}).put(flags).put(size_field);  // max 256
        b.put(uint64_t{0x1000}).put(uint64_t{0x2000}).put(uint64_t{0x3000});
        b.put(next_avail).put(next_avail).put(next_avail);
        ops.resize(op_count, op_pop);
        b.append(ops);
        b.append(ram);
        return b.take();
    };
    const std::vector<uint8_t> walk = {op_pop, op_add_used | (3 << 3), op_should_notify, op_pop, op_pop,
                                       op_add_used, op_add_used, op_save_restore, op_pop, op_pop,
                                       op_save, op_driver_publish | (1 << 3), op_pop, op_add_used,
                                       op_driver_flags | (1 << 3), op_should_notify, op_reset, op_pop};
    seeds.emplace_back("walk", seed(0, 3, walk));
    seeds.emplace_back("event-idx", seed(flag_event_idx, 3, walk));
    seeds.emplace_back("restored", seed(flag_restore | flag_event_idx, 3, walk, 0));
    seeds.emplace_back("raw-size", seed(flag_raw_size, 8, walk));
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
    const auto ops = in.bytes(op_count);
    const auto image = in.bytes(ram_bytes);
    const auto ram = mem.span(0, ram_bytes);
    std::fill(std::copy(image.begin(), image.end(), ram.begin()), ram.end(), uint8_t{0});

    Virtqueue q(config.max_size);
    if (!set_up(q, config, mem))
        return 0;
    std::deque<uint16_t> in_flight;  // heads popped and not yet returned, oldest first
    bool broken = false;             // pop() threw GuestError: unusable until reset

    for (const uint8_t byte : ops) {
        const auto arg = static_cast<uint8_t>(byte >> 3);
        try {
            switch (static_cast<Op>(byte & 7)) {
            case op_pop: {
                if (broken)
                    break;
                const uint16_t before = q.in_flight();
                try {
                    if (auto chain = q.pop(mem)) {
                        check_chain(*chain, q, mem);
                        in_flight.push_back(chain->head);
                    }
                } catch (const ChainError& e) {
                    // The head is consumed and owed back, like a good chain.
                    check(q.in_flight() == static_cast<uint16_t>(before + 1), "ChainError did not consume the head");
                    in_flight.push_back(e.head());
                }
                break;
            }
            case op_add_used:
                if (in_flight.empty())
                    break;
                q.add_used(mem, in_flight.front(), arg * 97u);
                in_flight.pop_front();
                break;
            case op_should_notify:
                q.should_notify(mem);
                break;
            case op_save:
                q.save();
                break;
            case op_driver_publish:
                if (mem.contains(q.avail_addr() + 2, 2))
                    driver_write_u16(mem, q.avail_addr() + 2,
                                     static_cast<uint16_t>(mem.read_obj<uint16_t>(q.avail_addr() + 2) + arg + 1));
                break;
            case op_driver_flags:
                driver_write_u16(mem, q.avail_addr(), arg & 1);
                driver_write_u16(mem, q.avail_addr() + 4 + 2ull * q.size(), arg);
                break;
            case op_save_restore: {
                const Virtqueue::State saved = q.save();
                Virtqueue copy(q.max_size());
                try {
                    copy.restore(saved, mem);
                } catch (const Error&) {
                    // restore() refuses more chains in flight than the queue has entries, which
                    // only a driver that reuses descriptors it never got back can cause.
                    check(q.in_flight() > q.size(), "restore() refused what save() produced");
                    break;
                }
                check(copy.save() == saved, "save -> restore -> save differs");
                q = copy;
                break;
            }
            case op_reset:
                q.reset();
                in_flight.clear();
                broken = false;
                if (!set_up(q, config, mem))
                    return 0;
                break;
            }
        } catch (const ChainError&) {
            finding("ChainError outside pop()");
        } catch (const GuestError&) {
            // The ring itself left RAM or the driver moved avail->idx too far.
            broken = true;
        }
    }
    return 0;
}
