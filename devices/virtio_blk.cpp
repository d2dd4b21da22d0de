#include "devices/virtio_blk.hpp"

#include <linux/virtio_ids.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <fmt/format.h>
#include <mutex>

namespace agentvm {

namespace {

BlkRequest reject(BlkRequest req, uint8_t status, std::string why)
{
    req.status = status;
    req.error = std::move(why);
    return req;
}

} // namespace

BlkRequest parse_blk_request(const DescriptorChain& chain, const GuestMemory& mem, uint64_t capacity_sectors)
{
    BlkRequest req;
    const auto& descs = chain.descriptors;
    if (descs.empty())
        return reject(std::move(req), VIRTIO_BLK_S_IOERR, "empty chain");

    // The status byte first: without it there is no way to report any other error.
    const Descriptor& last = descs.back();
    if (!last.writable || last.len < 1)
        return reject(std::move(req), VIRTIO_BLK_S_IOERR, "last descriptor is not a writable status byte");
    req.status_addr = last.addr + last.len - 1;  // in RAM: the queue checked addr+len
    if (descs.size() < 2)
        return reject(std::move(req), VIRTIO_BLK_S_IOERR, "no request header");

    const Descriptor& hdr_desc = descs.front();
    if (hdr_desc.writable || hdr_desc.len != sizeof(virtio_blk_outhdr))
        return reject(std::move(req), VIRTIO_BLK_S_IOERR,
                      fmt::format("header descriptor must be readable and {} bytes (is {} bytes, {})",
                                  sizeof(virtio_blk_outhdr), hdr_desc.len,
                                  hdr_desc.writable ? "writable" : "readable"));
    // Copied once; the guest may change its copy, ours stays what we validate.
    const auto hdr = mem.read_obj<virtio_blk_outhdr>(hdr_desc.addr);
    req.type = hdr.type;
    req.sector = hdr.sector;

    req.data.assign(descs.begin() + 1, descs.end() - 1);
    for (const auto& d : req.data)
        req.data_len += d.len;  // at most 254 * 4 GiB: no overflow
    auto all = [&](bool writable) {
        return std::all_of(req.data.begin(), req.data.end(),
                           [&](const Descriptor& d) { return d.writable == writable; });
    };

    switch (req.type) {
    case VIRTIO_BLK_T_IN:
    case VIRTIO_BLK_T_OUT: {
        const bool in = req.type == VIRTIO_BLK_T_IN;
        if (!all(in))
            return reject(std::move(req), VIRTIO_BLK_S_IOERR,
                          fmt::format("{} data buffers must all be {}", in ? "read" : "write",
                                      in ? "writable" : "readable"));
        if (req.data_len % CowDisk::sector_size != 0)
            return reject(std::move(req), VIRTIO_BLK_S_IOERR,
                          fmt::format("data length {} is not a multiple of 512", req.data_len));
        if (req.data_len > blk_max_request_bytes)
            return reject(std::move(req), VIRTIO_BLK_S_IOERR, fmt::format("data length {} too large", req.data_len));
        const uint64_t count = req.data_len / CowDisk::sector_size;
        if (req.sector > capacity_sectors || count > capacity_sectors - req.sector)
            return reject(std::move(req), VIRTIO_BLK_S_IOERR,
                          fmt::format("sectors [{}, +{}) are beyond the disk's {}", req.sector, count,
                                      capacity_sectors));
        return req;
    }
    case VIRTIO_BLK_T_FLUSH:
        if (!req.data.empty())
            return reject(std::move(req), VIRTIO_BLK_S_IOERR, "flush with data buffers");
        return req;
    case VIRTIO_BLK_T_GET_ID:
        if (!all(true))
            return reject(std::move(req), VIRTIO_BLK_S_IOERR, "get-id buffers must be writable");
        return req;
    default:
        return reject(std::move(req), VIRTIO_BLK_S_UNSUPP, fmt::format("unsupported request type {}", req.type));
    }
}

VirtioBlk::VirtioBlk(CowDisk disk, EventLoop& loop, std::string serial)
    : disk_(std::move(disk)), loop_(loop), serial_(std::move(serial))
{
    if (serial_.size() > VIRTIO_BLK_ID_BYTES)
        serial_.resize(VIRTIO_BLK_ID_BYTES);
}

uint32_t VirtioBlk::device_type() const
{
    return VIRTIO_ID_BLOCK;
}

void VirtioBlk::read_config(uint64_t offset, std::span<uint8_t> data) const
{
    virtio_blk_config cfg{};
    cfg.capacity = disk_.capacity_sectors();
    cfg.seg_max = seg_max;
    read_config_struct(cfg, offset, data);
}

void VirtioBlk::write_config(uint64_t offset, std::span<const uint8_t> data)
{
    // Without VIRTIO_BLK_F_CONFIG_WCE every field is read-only.
    guest_warn(warn_, "virtio-blk: ignoring {}-byte config write at {:#x}", data.size(), offset);
}

void VirtioBlk::activate(const VirtioContext& ctx)
{
    ctx_ = ctx;
    active_ = true;
}

void VirtioBlk::reset()
{
    active_ = false;
    ++generation_;
    // The transport holds mutex() once; waiting releases it, so completions can run (and are
    // dropped: the generation moved on, and the device is inactive).
    quiesced_.wait(mutex(), [this] { return in_flight_ == 0 || abandon_resets_; });
    ctx_ = {};
}

void VirtioBlk::abandon_resets()
{
    std::lock_guard lock(mutex());
    abandon_resets_ = true;
    quiesced_.notify_all();
}

size_t VirtioBlk::in_flight() const
{
    std::lock_guard lock(mutex());
    return in_flight_;
}

void VirtioBlk::process_queue(size_t index)
{
    std::lock_guard lock(mutex());
    if (!active_ || index != 0)
        return;
    Virtqueue& queue = ctx_.queues[0];
    const GuestMemory& mem = *ctx_.mem;
    bool used_added = false;
    PopOutcome outcome;
    while (auto chain = take_chain(queue, ctx_, "virtio-blk", warn_, outcome))
        handle(queue, *chain, used_added);
    used_added |= outcome.returned_malformed;
    if (used_added && queue.should_notify(mem))
        ctx_.signal_used();
}

void VirtioBlk::handle(Virtqueue& queue, const DescriptorChain& chain, bool& used_added)
{
    const GuestMemory& mem = *ctx_.mem;
    BlkRequest req = parse_blk_request(chain, mem, disk_.capacity_sectors());
    if (req.status != VIRTIO_BLK_S_OK) {
        guest_warn(warn_, "virtio-blk: request {} rejected: {}", chain.head, req.error);
        complete(queue, chain.head, req.status_addr, req.status, req.status_addr ? 1 : 0);
        used_added = true;
        return;
    }
    switch (req.type) {
    case VIRTIO_BLK_T_IN:
    case VIRTIO_BLK_T_OUT:
        if (req.data_len == 0)
            break;
        submit(queue, req, chain.head, used_added);
        return;
    case VIRTIO_BLK_T_FLUSH:
        // Nothing to make durable: the overlay dies with the VM, and a write is acknowledged
        // only after it completed, so every acknowledged write is already visible to reads.
        break;
    case VIRTIO_BLK_T_GET_ID: {
        std::array<uint8_t, VIRTIO_BLK_ID_BYTES> id{};  // NUL-padded; not terminated at 20 bytes
        std::copy(serial_.begin(), serial_.end(), id.begin());
        uint64_t written = 0;
        for (const auto& d : req.data) {
            const uint64_t n = std::min<uint64_t>(d.len, id.size() - written);
            mem.write(d.addr, std::span<const uint8_t>(id.data() + written, n));
            written += n;
        }
        complete(queue, chain.head, req.status_addr, VIRTIO_BLK_S_OK, static_cast<uint32_t>(written + 1));
        used_added = true;
        return;
    }
    default:
        break;
    }
    complete(queue, chain.head, req.status_addr, VIRTIO_BLK_S_OK, 1);
    used_added = true;
}

void VirtioBlk::submit(Virtqueue& queue, const BlkRequest& req, uint16_t head, bool& used_added)
{
    const GuestMemory& mem = *ctx_.mem;
    std::vector<iovec> iov;
    iov.reserve(req.data.size());
    for (const auto& d : req.data) {
        if (d.len == 0)
            continue;
        const auto s = mem.span(d.addr, d.len);
        iov.push_back({s.data(), s.size()});
    }
    const bool in = req.type == VIRTIO_BLK_T_IN;
    const auto used_len = static_cast<uint32_t>(in ? req.data_len + 1 : 1);
    // The completion captures the generation, not the queue: after a reset (or a restore that
    // replaced the queues) it must not touch them.
    auto done = [this, generation = generation_, head, status_addr = req.status_addr, used_len,
                 expected = req.data_len](int32_t res) {
        std::lock_guard lock(mutex());
        if (--in_flight_ == 0)
            quiesced_.notify_all();
        if (generation != generation_ || !active_)
            return;
        if (res < 0)
            guest_warn(warn_, "virtio-blk: disk I/O failed: {}", std::strerror(-res));
        const bool ok = res >= 0 && static_cast<uint64_t>(res) == expected;
        Virtqueue& q = ctx_.queues[0];
        complete(q, head, status_addr, ok ? VIRTIO_BLK_S_OK : VIRTIO_BLK_S_IOERR, ok ? used_len : 1);
        if (q.should_notify(*ctx_.mem))
            ctx_.signal_used();
    };
    ++in_flight_;
    try {
        if (in)
            disk_.read(loop_, req.sector, iov, std::move(done));
        else
            disk_.write(loop_, req.sector, iov, std::move(done));
    } catch (const GuestError& e) {
        // The disk refused before submitting anything (parse_blk_request should have caught it).
        --in_flight_;
        guest_warn(warn_, "virtio-blk: request {} refused by the disk: {}", head, e.what());
        complete(queue, head, req.status_addr, VIRTIO_BLK_S_IOERR, 1);
        used_added = true;
    } catch (...) {
        --in_flight_;  // a host failure: nothing was submitted, and the VMM stops
        throw;
    }
}

void VirtioBlk::complete(Virtqueue& queue, uint16_t head, std::optional<uint64_t> status_addr, uint8_t status,
                         uint32_t used_len)
{
    const GuestMemory& mem = *ctx_.mem;
    if (status_addr)
        mem.write_obj<uint8_t>(*status_addr, status);
    queue.add_used(mem, head, used_len);
}

VirtioBlk::State VirtioBlk::save() const
{
    std::lock_guard lock(mutex());
    if (in_flight_ != 0)
        throw Error(fmt::format("virtio-blk: cannot save with {} requests in flight; drain the loop first",
                                in_flight_));
    return {disk_.save()};
}

void VirtioBlk::restore(const State& state, Fd disk_layer)
{
    std::lock_guard lock(mutex());
    if (in_flight_ != 0)
        throw Error("virtio-blk: cannot restore with requests in flight");
    disk_.restore(state.disk, std::move(disk_layer));
}

void VirtioBlk::restore(const State& state,
                        std::vector<std::pair<Fd, std::vector<std::pair<uint64_t, uint64_t>>>> layers)
{
    std::lock_guard lock(mutex());
    if (in_flight_ != 0)
        throw Error("virtio-blk: cannot restore with requests in flight");
    for (auto& [file, ranges] : layers)
        disk_.add_layer(std::move(file), ranges);
    if (disk_.save() != state.disk)
        throw Error("virtio-blk: the snapshot's disk layers do not hold the sectors its state records");
}

} // namespace agentvm
