// Fuzzes virtio-blk end to end (devices/virtio_blk.hpp): a driver sets the device up through
// the virtio-mmio registers with ring addresses from the input, over 16 pages of guest RAM the
// input fills, then kicks the request queue, moves avail->idx, pokes registers and resets the
// device with I/O in flight, while the requests (parse_blk_request, then copy-on-write reads
// and writes through the io_uring loop) run against a 64-sector disk.
//
// A guest cannot make the device throw: process_queue, the completions and the register file
// handle every guest mistake themselves (STYLE.md: guest mistakes never kill the VMM). So this
// target catches nothing; any exception, crash or sanitizer report is a finding.
#include <linux/virtio_blk.h>
#include <linux/virtio_config.h>
#include <linux/virtio_mmio.h>
// The legacy part of virtio_ring.h (vring_init) is not valid C++; we need none of it.
#define VIRTIO_RING_NO_LEGACY
#include <linux/virtio_ring.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <span>
#include <thread>
#include <vector>

#include "devices/cow_disk.hpp"
#include "devices/virtio_blk.hpp"
#include "devices/virtio_mmio.hpp"
#include "tests/fuzz/fuzz_support.hpp"
#include "tests/support/mmio_driver.hpp"
#include "common/error.hpp"
#include "core/event_loop.hpp"
#include "common/fd.hpp"
#include "core/guest_memory.hpp"

using namespace agentvm;
using namespace agentvm::fuzz;
using agentvm::test::MmioDriver;

namespace {

constexpr uint64_t ram_bytes = 16 * 4096;
constexpr uint64_t disk_sectors = 64;
constexpr size_t op_count = 16;

enum Flags : uint8_t {
    flag_no_event_idx = 1,  // negotiate without VIRTIO_RING_F_EVENT_IDX
    flag_raw_size = 2,      // QueueNum as written, not rounded to a power of two
};

enum Op : uint8_t {
    op_kick,          // QueueNotify, then run the loop until every request completed
    op_kick_no_wait,  // QueueNotify, leaving reads and writes in flight
    op_driver_publish,
    op_driver_flags,
    op_write_register,
    op_read_register,
    op_reset,         // the driver writes Status 0, maybe with I/O in flight
    op_save,          // quiesce and save, as a snapshot does
};

struct OpBytes {
    uint8_t op;
    uint8_t arg;
    uint32_t value;
};

struct Config {
    uint8_t flags;
    uint16_t queue_num;
    uint64_t desc, avail, used;
};

Config read_config(Input& in)
{
    Config c{};
    c.flags = in.byte();
    const uint16_t num = in.take<uint16_t>();
    c.queue_num = (c.flags & flag_raw_size) ? num : static_cast<uint16_t>(1u << (num % 9));
    c.desc = in.take<uint64_t>();
    c.avail = in.take<uint64_t>();
    c.used = in.take<uint64_t>();
    return c;
}

// The base image, unlinked from birth: a crash leaves no file behind. Each iteration's
// CowDisk gets a dup of it (and makes its own O_TMPFILE overlay, which leaves nothing either).
int base_image_fd()
{
    static const int fd = [] {
        const int memfd = ::memfd_create("fuzz-virtio-blk-base", MFD_CLOEXEC);
        check(memfd >= 0, "memfd_create for the base image");
        std::vector<uint8_t> bytes(disk_sectors * CowDisk::sector_size);
        for (size_t i = 0; i < bytes.size(); ++i)
            bytes[i] = static_cast<uint8_t>(i * 31 + i / 512);
        check(::pwrite(memfd, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size()),
              "writing the base image");
        return memfd;
    }();
    return fd;
}

void bring_up(const MmioDriver& regs, const Config& c)
{
    uint64_t features = VirtioBlk::features;
    if (c.flags & flag_no_event_idx)
        features &= ~(1ull << VIRTIO_RING_F_EVENT_IDX);
    regs.negotiate(features);
    regs.wr(VIRTIO_MMIO_QUEUE_SEL, 0);
    regs.wr(VIRTIO_MMIO_QUEUE_NUM, c.queue_num);
    regs.wr(VIRTIO_MMIO_QUEUE_DESC_LOW, static_cast<uint32_t>(c.desc));
    regs.wr(VIRTIO_MMIO_QUEUE_DESC_HIGH, static_cast<uint32_t>(c.desc >> 32));
    regs.wr(VIRTIO_MMIO_QUEUE_AVAIL_LOW, static_cast<uint32_t>(c.avail));
    regs.wr(VIRTIO_MMIO_QUEUE_AVAIL_HIGH, static_cast<uint32_t>(c.avail >> 32));
    regs.wr(VIRTIO_MMIO_QUEUE_USED_LOW, static_cast<uint32_t>(c.used));
    regs.wr(VIRTIO_MMIO_QUEUE_USED_HIGH, static_cast<uint32_t>(c.used >> 32));
    regs.wr(VIRTIO_MMIO_QUEUE_READY, 1);
    regs.wr(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK |
                                    VIRTIO_CONFIG_S_DRIVER_OK);
}

void driver_write_u16(const GuestMemory& mem, uint64_t gpa, uint16_t value)
{
    if (mem.contains(gpa, sizeof(value)))
        mem.write_obj(gpa, value);
}

uint16_t driver_read_u16(const GuestMemory& mem, uint64_t gpa)
{
    return mem.contains(gpa, 2) ? mem.read_obj<uint16_t>(gpa) : 0;
}

// A register write as a vCPU makes it. A reset waits until no request is in flight, and in the
// VMM the I/O loop completes them on its own thread; here, with I/O in flight, the write runs
// on a thread of its own while this one runs the loop (a write on this thread would wait for
// completions only this thread can run).
void vcpu_write(const MmioDriver& regs, const VirtioBlk& blk, EventLoop& loop, uint64_t offset, uint32_t value)
{
    if (blk.in_flight() == 0) {
        regs.wr(offset, value);
        return;
    }
    std::thread vcpu([&] { regs.wr(offset, value); });
    loop.drain();
    vcpu.join();
}

// Seeds: a queue of 8 at 0x1000/0x1200/0x1400, request i's header at 0x2000 + 0x20 * i and
// its status byte 16 bytes after it, data from 0x3000.
struct SeedRing {
    std::vector<uint8_t> ram = std::vector<uint8_t>(0x3000, 0);
    uint16_t next_desc = 0;
    uint16_t avail_idx = 0;

    template <typename T>
    void put(uint64_t gpa, const T& value)
    {
        std::memcpy(ram.data() + gpa, &value, sizeof(value));
    }
    // A request: header, data buffers (gpa, len, device-writable), status byte.
    void request(uint32_t type, uint64_t sector, std::vector<vring_desc> data)
    {
        const uint16_t head = next_desc;
        const uint64_t hdr_gpa = 0x2000 + 0x20ull * avail_idx;
        virtio_blk_outhdr hdr{};
        hdr.type = type;
        hdr.sector = sector;
        put(hdr_gpa, hdr);
        std::vector<vring_desc> chain{{hdr_gpa, 16, 0, 0}};
        chain.insert(chain.end(), data.begin(), data.end());
        chain.push_back({hdr_gpa + 16, 1, VRING_DESC_F_WRITE, 0});
        for (size_t i = 0; i < chain.size(); ++i) {
            const auto idx = static_cast<uint16_t>((head + i) % 8);
            if (i + 1 < chain.size()) {
                chain[i].flags |= VRING_DESC_F_NEXT;
                chain[i].next = static_cast<uint16_t>((idx + 1) % 8);
            }
            put(0x1000 + 16ull * idx, chain[i]);
        }
        next_desc = static_cast<uint16_t>((head + chain.size()) % 8);
        put(0x1200 + 4 + 2ull * (avail_idx % 8), head);
        put(0x1200 + 2, ++avail_idx);
    }
};

std::vector<uint8_t> seed(const SeedRing& ring, std::vector<OpBytes> ops, uint8_t flags = 0)
{
    Builder b;
    b.put(flags).put(uint16_t{3});  // 1 << 3 = 8 entries
    b.put(uint64_t{0x1000}).put(uint64_t{0x1200}).put(uint64_t{0x1400});
    ops.resize(op_count, OpBytes{op_kick, 0, 0});
    for (const OpBytes& op : ops)
        b.put(op.op).put(op.arg).put(op.value);
    b.append(ring.ram);
    return b.take();
}

Seeds make_seeds()
{
    Seeds seeds;
    {
        SeedRing r;  // one of each request type
        r.request(VIRTIO_BLK_T_OUT, 3, {{0x3000, 1024, 0, 0}});
        r.request(VIRTIO_BLK_T_IN, 2, {{0x3400, 512, VRING_DESC_F_WRITE, 0}, {0x3800, 1024, VRING_DESC_F_WRITE, 0}});
        r.request(VIRTIO_BLK_T_FLUSH, 0, {});
        r.request(VIRTIO_BLK_T_GET_ID, 0, {{0x3c00, 20, VRING_DESC_F_WRITE, 0}});
        seeds.emplace_back("types", seed(r, {{op_kick, 0, 0}, {op_save, 0, 0}}));
        seeds.emplace_back("no-event-idx", seed(r, {{op_kick_no_wait, 0, 0}, {op_kick, 0, 0}}, flag_no_event_idx));
        seeds.emplace_back("reset-in-flight",
                           seed(r, {{op_kick_no_wait, 0, 0}, {op_reset, 0, 0}, {op_kick, 0, 0},
                                    {op_read_register, VIRTIO_MMIO_CONFIG / 4, 7}}));
    }
    {
        SeedRing r;  // malformed: beyond the disk, odd length, unsupported type
        r.request(VIRTIO_BLK_T_IN, disk_sectors - 1, {{0x3000, 1024, VRING_DESC_F_WRITE, 0}});
        r.request(VIRTIO_BLK_T_OUT, 0, {{0x3000, 500, 0, 0}});
        r.request(VIRTIO_BLK_T_DISCARD, 0, {});
        seeds.emplace_back("malformed",
                           seed(r, {{op_kick, 0, 0}, {op_driver_publish, 1, 0}, {op_driver_flags, 1, 2}, {op_kick, 0, 0},
                                    {op_write_register, VIRTIO_MMIO_QUEUE_NOTIFY / 4, 0}}));
    }
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
    static EventLoop loop;
    Input in(data, size);
    const Config config = read_config(in);
    std::vector<OpBytes> ops;
    for (size_t i = 0; i < op_count; ++i)
        ops.push_back({in.byte(), in.byte(), in.take<uint32_t>()});
    const auto image = in.bytes(ram_bytes);
    const auto ram = mem.span(0, ram_bytes);
    std::fill(std::copy(image.begin(), image.end(), ram.begin()), ram.end(), uint8_t{0});

    VirtioBlk blk(CowDisk(Fd(::dup(base_image_fd())), "fuzz base image"), loop);
    std::vector<uint16_t> notified;  // QueueNotify writes that reached the register file
    VirtioMmioTransport mmio(mem, blk, [] {}, [&](uint16_t q) { notified.push_back(q); });
    const MmioDriver regs(mmio);
    bring_up(regs, config);

    for (const OpBytes& op : ops) {
        switch (static_cast<Op>(op.op & 7)) {
        case op_kick:
            mmio.notify_queue(0);
            loop.drain();
            break;
        case op_kick_no_wait:
            mmio.notify_queue(0);
            break;
        case op_driver_publish: {
            const uint64_t idx_gpa = config.avail + 2;
            driver_write_u16(mem, idx_gpa, static_cast<uint16_t>(driver_read_u16(mem, idx_gpa) + op.arg % 8 + 1));
            break;
        }
        case op_driver_flags:
            driver_write_u16(mem, config.avail, op.arg & 1);
            driver_write_u16(mem, config.avail + 4 + 2ull * config.queue_num, static_cast<uint16_t>(op.value));
            break;
        case op_write_register:
            vcpu_write(regs, blk, loop, 4ull * op.arg, op.value);
            for (const uint16_t q : notified)
                mmio.notify_queue(q);
            notified.clear();
            break;
        case op_read_register: {
            uint8_t bytes[8];
            mmio.bus_read(4ull * op.arg + (op.value >> 8) % 4, std::span(bytes, op.value % 8 + 1));
            break;
        }
        case op_reset:
            vcpu_write(regs, blk, loop, VIRTIO_MMIO_STATUS, 0);
            loop.drain();
            bring_up(regs, config);
            break;
        case op_save:
            loop.drain();
            blk.save();
            mmio.save();
            break;
        }
    }
    loop.drain();
    check(blk.in_flight() == 0, "requests in flight after the loop drained");
    regs.wr(VIRTIO_MMIO_STATUS, 0);
    return 0;
}
