#include "devices/state_json.hpp"

#include <linux/virtio_config.h>
// The legacy part of virtio_ring.h (vring_init) is not valid C++; we need none of it.
#ifndef VIRTIO_RING_NO_LEGACY
#define VIRTIO_RING_NO_LEGACY
#endif
#include <linux/virtio_ring.h>

#include <algorithm>
#include <concepts>
#include <limits>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "common/error.hpp"

namespace agentvm {

using nlohmann::json;
using namespace state_codec;

// --- encoding -----------------------------------------------------------------------------

void to_json(json& j, const Serial::State& s)
{
    j = {
        {"ier", s.ier},
        {"lcr", s.lcr},
        {"mcr", s.mcr},
        {"scr", s.scr},
        {"dll", s.dll},
        {"dlm", s.dlm},
        {"fifo_enabled", s.fifo_enabled},
        {"thr_interrupt", s.thr_interrupt},
        {"rx_fifo", json::binary(s.rx_fifo)},
    };
}

void to_json(json& j, const Virtqueue::State& s)
{
    j = {
        {"size", s.size},
        {"ready", s.ready},
        {"event_idx", s.event_idx},
        {"desc_addr", s.desc_addr},
        {"avail_addr", s.avail_addr},
        {"used_addr", s.used_addr},
        {"next_avail", s.next_avail},
        {"next_used", s.next_used},
        {"signalled_used", s.signalled_used},
    };
}

void to_json(json& j, const VirtioMmioTransport::State& s)
{
    json queues = json::array();
    for (const auto& q : s.queues)
        queues.push_back(q);
    j = {
        {"status", s.status},
        {"device_features_sel", s.device_features_sel},
        {"driver_features_sel", s.driver_features_sel},
        {"driver_features", s.driver_features},
        {"queue_sel", s.queue_sel},
        {"interrupt_status", s.interrupt_status},
        {"config_generation", s.config_generation},
        {"queues", std::move(queues)},
    };
}

void to_json(json& j, const CowDisk::State& s)
{
    // Runs of written sectors, [[first, count], ...]: a guest writes few places of its disk,
    // and a number per bitmap word (22 k for the default disk) cost tens of milliseconds to
    // decode, and to hash, on every restore of an emulated host.
    std::vector<IndexRun> runs;
    for (uint64_t sector = 0; sector < s.written.size() * 64;) {
        if (!(s.written[sector / 64] >> (sector % 64) & 1)) {
            ++sector;
            continue;
        }
        const uint64_t first = sector;
        while (sector < s.written.size() * 64 && (s.written[sector / 64] >> (sector % 64) & 1))
            ++sector;
        runs.push_back({first, sector - first});
    }
    j = {{"capacity_sectors", s.capacity_sectors}, {"written", runs_to_json(runs)}};
}

void to_json(json& j, const VirtioBlk::State& s)
{
    j = {{"disk", s.disk}};
}

void to_json(json& j, const VirtioVsock::State& s)
{
    j = {{"guest_cid", s.guest_cid}};
}

// --- decoding -----------------------------------------------------------------------------

template <>
Serial::State state_from_json<Serial::State>(const json& j, std::string_view path)
{
    Fields f(j, path);
    Serial::State s;
    s.ier = f.uint<uint8_t>("ier");
    s.lcr = f.uint<uint8_t>("lcr");
    s.mcr = f.uint<uint8_t>("mcr");
    s.scr = f.uint<uint8_t>("scr");
    s.dll = f.uint<uint8_t>("dll");
    s.dlm = f.uint<uint8_t>("dlm");
    s.fifo_enabled = f.boolean("fifo_enabled");
    s.thr_interrupt = f.boolean("thr_interrupt");
    s.rx_fifo = f.bytes("rx_fifo");
    f.done();
    // restore() checks the FIFO's length and the reserved IER and MCR bits; every other value
    // is one the guest can reach.
    return s;
}

template <>
Virtqueue::State state_from_json<Virtqueue::State>(const json& j, std::string_view path)
{
    Fields f(j, path);
    Virtqueue::State s;
    s.size = f.uint<uint16_t>("size");
    s.ready = f.boolean("ready");
    s.event_idx = f.boolean("event_idx");
    s.desc_addr = f.uint<uint64_t>("desc_addr");
    s.avail_addr = f.uint<uint64_t>("avail_addr");
    s.used_addr = f.uint<uint64_t>("used_addr");
    s.next_avail = f.uint<uint16_t>("next_avail");
    s.next_used = f.uint<uint16_t>("next_used");
    s.signalled_used = f.uint<uint16_t>("signalled_used");
    f.done();

    // restore() checks the size against the queue's maximum and the rings of a ready queue
    // against guest RAM. The indices move only while a device uses a ready queue.
    if (!s.ready && (s.next_avail != 0 || s.next_used != 0 || s.signalled_used != 0))
        fail(path, fmt::format("a queue that is not ready has moved its indices (avail {}, used {}, signalled {})",
                               s.next_avail, s.next_used, s.signalled_used));
    // restore() allows up to `size` chains in flight, but a snapshot has none: every device
    // gives back each chain it took before its save() succeeds (virtio-blk refuses to save
    // with requests in flight, virtio-vsock returns chains at once), and no State holds a
    // chain, so one in flight could never be returned to the driver.
    if (s.next_avail != s.next_used)
        fail(f.path("next_used"), fmt::format("{} chains in flight (next_avail {}, next_used {}); a snapshot has none",
                                              static_cast<uint16_t>(s.next_avail - s.next_used), s.next_avail,
                                              s.next_used));
    return s;
}

template <>
VirtioMmioTransport::State state_from_json<VirtioMmioTransport::State>(const json& j, std::string_view path)
{
    Fields f(j, path);
    VirtioMmioTransport::State s;
    s.status = f.uint<uint32_t>("status");
    s.device_features_sel = f.uint<uint32_t>("device_features_sel");
    s.driver_features_sel = f.uint<uint32_t>("driver_features_sel");
    s.driver_features = f.uint<uint64_t>("driver_features");
    s.queue_sel = f.uint<uint32_t>("queue_sel");
    s.interrupt_status = f.uint<uint32_t>("interrupt_status");
    s.config_generation = f.uint<uint32_t>("config_generation");
    const std::string queues_path = f.path("queues");
    const json& queues = f.array("queues");
    for (size_t i = 0; i < queues.size(); ++i)
        s.queues.push_back(state_from_json<Virtqueue::State>(queues[i], element(queues_path, i)));
    f.done();

    // restore() checks the status and interrupt bits, DRIVER_OK after FEATURES_OK, the
    // features against those offered and the queue count. The rest of §3.1.1's order:
    if ((s.status & VIRTIO_CONFIG_S_DRIVER) && !(s.status & VIRTIO_CONFIG_S_ACKNOWLEDGE))
        fail(f.path("status"), fmt::format("{:#x} has DRIVER without ACKNOWLEDGE", s.status));
    if ((s.status & VIRTIO_CONFIG_S_FEATURES_OK) && !(s.status & VIRTIO_CONFIG_S_DRIVER))
        fail(f.path("status"), fmt::format("{:#x} has FEATURES_OK without DRIVER", s.status));
    // Only a live device fails its queues, raises interrupts and moves ring indices.
    const bool live = s.status & VIRTIO_CONFIG_S_DRIVER_OK;
    if ((s.status & VIRTIO_CONFIG_S_NEEDS_RESET) && !live)
        fail(f.path("status"), fmt::format("{:#x} has DEVICE_NEEDS_RESET without DRIVER_OK", s.status));
    if (s.interrupt_status != 0 && !live)
        fail(f.path("interrupt_status"), fmt::format("{:#x} before DRIVER_OK", s.interrupt_status));
    // DRIVER_OK gives every queue event_idx as negotiated; a reset clears it. (restore()
    // re-activates a live device, which would overwrite a mismatch.)
    const bool event_idx = live && (s.driver_features & (1ull << VIRTIO_RING_F_EVENT_IDX));
    for (size_t i = 0; i < s.queues.size(); ++i) {
        const Virtqueue::State& q = s.queues[i];
        if (q.event_idx != event_idx)
            fail(element(queues_path, i) + ".event_idx",
                 event_idx ? "off, yet VIRTIO_RING_F_EVENT_IDX was negotiated"
                           : "on, yet VIRTIO_RING_F_EVENT_IDX is not negotiated or DRIVER_OK is not set");
        if (!live && (q.next_avail != 0 || q.next_used != 0 || q.signalled_used != 0))
            fail(element(queues_path, i), "ring indices moved before DRIVER_OK");
    }
    return s;
}

template <>
CowDisk::State state_from_json<CowDisk::State>(const json& j, std::string_view path)
{
    Fields f(j, path);
    CowDisk::State s;
    s.capacity_sectors = f.uint<uint64_t>("capacity_sectors");
    if (s.capacity_sectors > max_snapshot_disk_sectors)
        fail(f.path("capacity_sectors"), fmt::format("{} sectors, more than the {} GiB a snapshot's disk may have",
                                                     s.capacity_sectors, max_snapshot_disk_sectors >> 21));
    s.written.assign((s.capacity_sectors + 63) / 64, 0);
    for (const IndexRun& run : runs_from_json(f.at("written"), f.path("written"), s.capacity_sectors, "sector",
                                              "the disk's")) {
        const uint64_t next_free = run.first + run.count;
        for (uint64_t sector = run.first; sector < next_free;) {
            if (sector % 64 == 0 && next_free - sector >= 64) {
                s.written[sector / 64] = ~0ull;
                sector += 64;
            } else {
                s.written[sector / 64] |= 1ull << (sector % 64);
                ++sector;
            }
        }
    }
    f.done();
    // restore() checks the capacity and the bitmap's length against the disk, and that no
    // bit lies past its end.
    return s;
}

template <>
VirtioBlk::State state_from_json<VirtioBlk::State>(const json& j, std::string_view path)
{
    Fields f(j, path);
    VirtioBlk::State s;
    s.disk = state_from_json<CowDisk::State>(f.at("disk"), f.path("disk"));
    f.done();
    return s;
}

template <>
VirtioVsock::State state_from_json<VirtioVsock::State>(const json& j, std::string_view path)
{
    Fields f(j, path);
    VirtioVsock::State s;
    s.guest_cid = f.uint<uint64_t>("guest_cid");
    f.done();
    // restore() checks the CID.
    return s;
}

} // namespace agentvm
