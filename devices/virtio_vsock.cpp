#include "devices/virtio_vsock.hpp"

#include <linux/virtio_ids.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <fmt/format.h>
#include <mutex>
#include <optional>

namespace agentvm {

// The le* fields of the UAPI structs are used as plain integers.
static_assert(std::endian::native == std::endian::little, "virtio-vsock assumes a little-endian host");

namespace {

constexpr bool known_op(uint16_t op)
{
    return op >= VIRTIO_VSOCK_OP_REQUEST && op <= VIRTIO_VSOCK_OP_CREDIT_REQUEST;
}

constexpr bool valid_guest_cid(uint64_t cid)
{
    // 0..2 are hypervisor, local and host; Linux keeps CIDs to 32 bits and U32_MAX is "any".
    return cid > vsock_host_cid && cid < 0xffffffffull;
}

uint64_t chain_bytes(const DescriptorChain& chain)
{
    uint64_t total = 0;
    for (const auto& d : chain.descriptors)
        total += d.len;  // at most 32768 * 4 GiB: no overflow
    return total;
}

bool all_writable(const DescriptorChain& chain, bool writable)
{
    return std::all_of(chain.descriptors.begin(), chain.descriptors.end(),
                       [&](const Descriptor& d) { return d.writable == writable; });
}

// Copies out.size() bytes starting `offset` bytes into the chain's buffers; the caller
// checked the chain is long enough.
void gather(const GuestMemory& mem, const DescriptorChain& chain, uint64_t offset, std::span<uint8_t> out)
{
    size_t done = 0;
    for (const auto& d : chain.descriptors) {
        if (done == out.size())
            break;
        if (offset >= d.len) {
            offset -= d.len;
            continue;
        }
        const size_t n = std::min<uint64_t>(d.len - offset, out.size() - done);
        mem.read(d.addr + offset, out.subspan(done, n));
        done += n;
        offset = 0;
    }
}

// Writes `in` from the start of the chain's buffers onwards; returns the bytes written.
uint64_t scatter(const GuestMemory& mem, const DescriptorChain& chain, uint64_t offset, std::span<const uint8_t> in)
{
    size_t done = 0;
    for (const auto& d : chain.descriptors) {
        if (done == in.size())
            break;
        if (offset >= d.len) {
            offset -= d.len;
            continue;
        }
        const size_t n = std::min<uint64_t>(d.len - offset, in.size() - done);
        mem.write(d.addr + offset, in.subspan(done, n));
        done += n;
        offset = 0;
    }
    return done;
}

VsockPacket reject(VsockPacket pkt, VsockPacket::Kind kind, std::string why)
{
    pkt.kind = kind;
    pkt.error = std::move(why);
    pkt.payload.clear();
    return pkt;
}

} // namespace

VsockPacket parse_vsock_packet(const DescriptorChain& chain, const GuestMemory& mem, uint64_t guest_cid)
{
    using Kind = VsockPacket::Kind;
    VsockPacket pkt;
    if (!all_writable(chain, false))
        return reject(std::move(pkt), Kind::drop, "tx chain has a device-writable descriptor");
    const uint64_t total = chain_bytes(chain);
    if (total < vsock_hdr_bytes)
        return reject(std::move(pkt), Kind::drop, fmt::format("tx chain of {} bytes has no full header", total));

    // The header may be split across descriptors: gather it, once, into our own copy.
    std::array<uint8_t, vsock_hdr_bytes> raw{};
    gather(mem, chain, 0, raw);
    std::memcpy(&pkt.hdr, raw.data(), raw.size());
    pkt.kind = Kind::ok;
    const virtio_vsock_hdr& h = pkt.hdr;

    if (h.src_cid != guest_cid)
        return reject(std::move(pkt), Kind::reset, fmt::format("src_cid {} is not the guest's {}", h.src_cid, guest_cid));
    if (h.dst_cid != vsock_host_cid)
        return reject(std::move(pkt), Kind::reset, fmt::format("dst_cid {} is not the host", h.dst_cid));
    if (h.type != VIRTIO_VSOCK_TYPE_STREAM)
        return reject(std::move(pkt), Kind::reset, fmt::format("unsupported socket type {}", h.type));
    if (!known_op(h.op))
        return reject(std::move(pkt), Kind::reset, fmt::format("unknown op {}", h.op));
    if (h.len > vsock_max_payload)
        return reject(std::move(pkt), Kind::reset, fmt::format("len {} exceeds the {}-byte packet cap", h.len, vsock_max_payload));
    if (h.len > total - vsock_hdr_bytes)
        return reject(std::move(pkt), Kind::reset,
                      fmt::format("len {} but only {} payload bytes in the chain", h.len, total - vsock_hdr_bytes));
    // Only RW carries a payload; other ops' len is ignored, as Linux does.
    if (h.op == VIRTIO_VSOCK_OP_RW && h.len != 0) {
        pkt.payload.resize(h.len);
        gather(mem, chain, vsock_hdr_bytes, pkt.payload);
    }
    return pkt;
}

VirtioVsock::VirtioVsock(VsockBackend& backend, uint64_t guest_cid) : backend_(backend), guest_cid_(guest_cid)
{
    if (!valid_guest_cid(guest_cid))
        throw Error(fmt::format("virtio-vsock: invalid guest CID {} (must be 3..2^32-2)", guest_cid));
}

uint32_t VirtioVsock::device_type() const
{
    return VIRTIO_ID_VSOCK;
}

void VirtioVsock::read_config(uint64_t offset, std::span<uint8_t> data) const
{
    virtio_vsock_config cfg{};
    cfg.guest_cid = guest_cid_;
    read_config_struct(cfg, offset, data);
}

void VirtioVsock::write_config(uint64_t offset, std::span<const uint8_t> data)
{
    // guest_cid is read-only for the driver (§5.10.4).
    guest_warn(warn_, "virtio-vsock: ignoring {}-byte config write at {:#x}", data.size(), offset);
}

void VirtioVsock::activate(const VirtioContext& ctx)
{
    ctx_ = ctx;
    active_ = true;
    broken_ = false;
}

void VirtioVsock::reset()
{
    // The driver is gone, and with it every guest socket. This runs on the thread that wrote
    // Status: the backend hears which connections went, and undoes them on its own thread.
    ctx_ = {};
    active_ = false;
    broken_ = false;
    std::fill(std::begin(used_added_), std::end(used_added_), false);
    control_.clear();
    std::vector<VsockConnId> gone;
    gone.reserve(conns_.size());
    for (const auto& [id, conn] : conns_)
        gone.push_back(id);
    conns_.clear();
    if (!gone.empty())
        backend_.on_reset(gone);
}

void VirtioVsock::process_queue(size_t index)
{
    std::lock_guard lock(mutex());
    if (index >= queue_count())
        return;
    // Whatever the queue: tx brings packets, rx and event bring buffers for what waits.
    pump();
}

VsockConnection* VirtioVsock::find(VsockConnId id)
{
    auto it = conns_.find(id);
    return it == conns_.end() ? nullptr : &it->second;
}

const VsockConnection* VirtioVsock::find(VsockConnId id) const
{
    auto it = conns_.find(id);
    return it == conns_.end() ? nullptr : &it->second;
}

void VirtioVsock::pump()
{
    if (!active_ || broken_)
        return;
    if (pumping_) {
        // A backend callback called back into the device: the outer pump goes round again.
        repump_ = true;
        return;
    }
    pumping_ = true;
    struct Reset {
        bool& flag;
        ~Reset() { flag = false; }
    } reset_pumping{pumping_};

    do {
        repump_ = false;
        const bool tx_blocked = drain_tx();
        deliver_rx();
        deliver_events();
        if (broken_)
            break;
        // Delivering replies made room: take more tx chains.
        if (tx_blocked && control_.size() < max_pending_control)
            repump_ = true;
    } while (repump_);

    bool notify = false;
    for (size_t i = 0; i < queue_count(); ++i) {
        if (!used_added_[i])
            continue;
        used_added_[i] = false;
        // Every queue's should_notify runs: it records what the driver has been told.
        if (ctx_.queues[i].should_notify(*ctx_.mem))
            notify = true;
    }
    if (notify)
        ctx_.signal_used();
}

void VirtioVsock::mark_used(size_t queue, uint16_t head, uint32_t len)
{
    ctx_.queues[queue].add_used(*ctx_.mem, head, len);
    used_added_[queue] = true;
}

bool VirtioVsock::drain_tx()
{
    Virtqueue& queue = ctx_.queues[tx_queue];
    const GuestMemory& mem = *ctx_.mem;
    while (control_.size() < max_pending_control) {
        PopOutcome outcome;
        const std::optional<DescriptorChain> chain = take_chain(queue, ctx_, "virtio-vsock tx", warn_, outcome);
        used_added_[tx_queue] |= outcome.returned_malformed;
        broken_ |= outcome.broken;
        if (!chain)
            return false;
        VsockPacket pkt = parse_vsock_packet(*chain, mem, guest_cid_);
        // The device writes nothing into tx buffers; the chain goes back before we act.
        mark_used(tx_queue, chain->head, 0);
        handle_packet(pkt);
        if (broken_ || !active_)
            return false;
    }
    return true;
}

void VirtioVsock::handle_packet(const VsockPacket& pkt)
{
    const virtio_vsock_hdr& h = pkt.hdr;
    const VsockConnId id{h.dst_port, h.src_port};
    switch (pkt.kind) {
    case VsockPacket::Kind::drop:
        guest_warn(warn_, "virtio-vsock: dropping tx chain: {}", pkt.error);
        return;
    case VsockPacket::Kind::reset: {
        guest_warn(warn_, "virtio-vsock: resetting {}->{}: {}", h.src_port, h.dst_port, pkt.error);
        const bool ours = h.src_cid == guest_cid_ && h.dst_cid == vsock_host_cid;
        if (ours && find(id))
            drop_connection(id, h.op != VIRTIO_VSOCK_OP_RST, true);
        else if (h.op != VIRTIO_VSOCK_OP_RST)  // never answer an RST with one
            control_.push(id, VIRTIO_VSOCK_OP_RST, ours ? vsock_host_cid : h.dst_cid);
        return;
    }
    case VsockPacket::Kind::ok:
        break;
    }

    VsockConnection* conn = find(id);
    if (conn) {
        conn->record_peer_credit(h.buf_alloc, h.fwd_cnt);
        if (conn->phase() == VsockConnection::Phase::connecting && h.op != VIRTIO_VSOCK_OP_RESPONSE &&
            h.op != VIRTIO_VSOCK_OP_RST) {
            guest_warn(warn_, "virtio-vsock: op {} on {}->{} before RESPONSE", h.op, h.src_port, h.dst_port);
            drop_connection(id, true, true);
            return;
        }
    } else if (h.op != VIRTIO_VSOCK_OP_REQUEST) {
        // No such connection: RST, unless that is what it is (§5.10.6.4).
        if (h.op != VIRTIO_VSOCK_OP_RST)
            control_.push(id, VIRTIO_VSOCK_OP_RST);
        return;
    }

    switch (h.op) {
    case VIRTIO_VSOCK_OP_REQUEST: {
        if (conn) {
            guest_warn(warn_, "virtio-vsock: REQUEST for existing connection {}->{}", h.src_port, h.dst_port);
            drop_connection(id, true, true);
            return;
        }
        if (conns_.size() >= max_connections || !backend_.on_connect_request(id)) {
            control_.push(id, VIRTIO_VSOCK_OP_RST);
            return;
        }
        VsockConnection fresh(VsockConnection::Phase::established);
        fresh.record_peer_credit(h.buf_alloc, h.fwd_cnt);
        if (!conns_.try_emplace(id, std::move(fresh)).second) {
            // The backend opened the same id from inside its callback; refuse both.
            drop_connection(id, true, true);
            return;
        }
        control_.push(id, VIRTIO_VSOCK_OP_RESPONSE);
        return;
    }
    case VIRTIO_VSOCK_OP_RESPONSE:
        if (conn->phase() != VsockConnection::Phase::connecting) {
            guest_warn(warn_, "virtio-vsock: RESPONSE on established {}->{}", h.src_port, h.dst_port);
            drop_connection(id, true, true);
            return;
        }
        conn->establish();
        backend_.on_connected(id);
        return;
    case VIRTIO_VSOCK_OP_RST:
        drop_connection(id, false, true);
        return;
    case VIRTIO_VSOCK_OP_SHUTDOWN: {
        const uint32_t flags = conn->shut_peer(h.flags);
        const bool both = conn->peer_shutdown() == vsock_shutdown_both;
        if (flags != 0)
            backend_.on_shutdown(id, flags);
        // Both directions closed: answer RST, as Linux's host side does (the guest's close()
        // waits for it).
        if (both && find(id))
            drop_connection(id, true, true);
        return;
    }
    case VIRTIO_VSOCK_OP_RW:
        handle_rw(id, *conn, pkt);
        return;
    case VIRTIO_VSOCK_OP_CREDIT_UPDATE:
        return;  // credit recorded above; the pump delivers what it now allows
    case VIRTIO_VSOCK_OP_CREDIT_REQUEST:
        queue_credit_update(id, *conn);
        return;
    default:
        return;  // parse_vsock_packet let only known ops through
    }
}

void VirtioVsock::handle_rw(VsockConnId id, VsockConnection& conn, const VsockPacket& pkt)
{
    if (conn.peer_stopped_sending()) {
        guest_warn(warn_, "virtio-vsock: data on {}->{} after the guest shut down sending", id.guest_port, id.host_port);
        drop_connection(id, true, true);
        return;
    }
    const auto len = static_cast<uint32_t>(pkt.payload.size());
    if (!conn.accept_rx(len)) {
        const VsockCounters& c = conn.counters();
        guest_warn(warn_, "virtio-vsock: {}->{} sent {} bytes beyond its credit ({} of {} in use)", id.guest_port,
                   id.host_port, len, c.rx_cnt - c.last_sent_fwd_cnt, conn_buf_alloc);
        drop_connection(id, true, true);
        return;
    }
    if (len == 0)
        return;
    size_t taken = len;
    if (!conn.host_stopped_reading())
        taken = backend_.on_data(id, pkt.payload);
    // else: the host reads no more; the bytes are discarded, which frees their credit.
    VsockConnection* again = find(id);  // the callback may have reset the connection
    if (!again)
        return;
    again->forwarded(taken);
    if (again->credit_update_due())
        queue_credit_update(id, *again);
}

void VirtioVsock::queue_credit_update(VsockConnId id, VsockConnection& conn)
{
    if (conn.want_credit_update())
        control_.push(id, VIRTIO_VSOCK_OP_CREDIT_UPDATE);
}

void VirtioVsock::drop_connection(VsockConnId id, bool rst, bool notify)
{
    conns_.erase(id);
    control_.forget(id);
    if (rst)
        control_.push(id, VIRTIO_VSOCK_OP_RST);
    if (notify)
        backend_.on_closed(id);
}

std::optional<VsockConnId> VirtioVsock::next_with_data() const
{
    // Round robin: the first connection with something to send after the last one served.
    auto pick = [&](auto first, auto last) -> std::optional<VsockConnId> {
        for (auto it = first; it != last; ++it)
            if (it->second.deliverable())
                return it->first;
        return std::nullopt;
    };
    const auto split = conns_.upper_bound(rr_cursor_);
    if (auto id = pick(split, conns_.end()))
        return id;
    return pick(conns_.begin(), split);
}

void VirtioVsock::deliver_rx()
{
    if (control_.rx_held([this] { return ctx_.queues[event_queue].avail_idx(*ctx_.mem); }))
        return;
    Virtqueue& queue = ctx_.queues[rx_queue];
    const GuestMemory& mem = *ctx_.mem;
    for (;;) {
        // Pick what goes next before taking a buffer: replies first (a RESPONSE must precede
        // the connection's data), then connections round robin.
        const bool control = !control_.empty();
        std::optional<VsockConnId> data_id;
        if (!control) {
            data_id = next_with_data();
            if (!data_id)
                return;
        }

        PopOutcome outcome;
        const std::optional<DescriptorChain> chain = take_chain(queue, ctx_, "virtio-vsock rx", warn_, outcome);
        used_added_[rx_queue] |= outcome.returned_malformed;
        broken_ |= outcome.broken;
        if (!chain)
            return;  // the guest has no buffers; the packet waits
        const uint64_t room = chain_bytes(*chain);
        // Data needs room for at least one payload byte; control packets are header only.
        const uint64_t need = vsock_hdr_bytes + (data_id && conns_.at(*data_id).queued() > 0 ? 1 : 0);
        if (!all_writable(*chain, true) || room < need) {
            guest_warn(warn_, "virtio-vsock: rx chain {} unusable ({} bytes, {})", chain->head, room,
                       all_writable(*chain, true) ? "too short for a header" : "has a device-readable descriptor");
            mark_used(rx_queue, chain->head, 0);
            continue;
        }

        virtio_vsock_hdr hdr{};
        hdr.dst_cid = guest_cid_;
        hdr.type = VIRTIO_VSOCK_TYPE_STREAM;
        std::vector<uint8_t> payload;
        std::optional<VsockConnId> space_freed;
        if (control) {
            const VsockReply c = *control_.pop();
            hdr.src_cid = c.src_cid;
            hdr.src_port = c.id.host_port;
            hdr.dst_port = c.id.guest_port;
            hdr.op = c.op;
            VsockConnection* conn = c.src_cid == vsock_host_cid ? find(c.id) : nullptr;
            if (conn && c.op != VIRTIO_VSOCK_OP_RST) {
                hdr.buf_alloc = conn_buf_alloc;
                hdr.fwd_cnt = conn->advertise(c.op == VIRTIO_VSOCK_OP_CREDIT_UPDATE);
            }
        } else {
            VsockConnection& conn = conns_.at(*data_id);
            rr_cursor_ = *data_id;
            hdr.src_cid = vsock_host_cid;
            hdr.src_port = data_id->host_port;
            hdr.dst_port = data_id->guest_port;
            hdr.buf_alloc = conn_buf_alloc;
            hdr.fwd_cnt = conn.advertise(false);
            if (conn.queued() > 0) {
                payload = conn.take_payload(room - vsock_hdr_bytes);
                hdr.op = VIRTIO_VSOCK_OP_RW;
                hdr.len = static_cast<uint32_t>(payload.size());
                if (conn.take_send_space())
                    space_freed = *data_id;
            } else {
                hdr.op = VIRTIO_VSOCK_OP_SHUTDOWN;
                hdr.flags = conn.take_shutdown();
            }
        }

        std::array<uint8_t, vsock_hdr_bytes> raw{};
        std::memcpy(raw.data(), &hdr, raw.size());
        uint64_t written = scatter(mem, *chain, 0, raw);
        written += scatter(mem, *chain, vsock_hdr_bytes, payload);
        mark_used(rx_queue, chain->head, static_cast<uint32_t>(written));
        if (space_freed)
            backend_.on_send_space(*space_freed);
    }
}

void VirtioVsock::deliver_events()
{
    Virtqueue& queue = ctx_.queues[event_queue];
    const GuestMemory& mem = *ctx_.mem;
    while (control_.event_pending()) {
        PopOutcome outcome;
        const std::optional<DescriptorChain> chain = take_chain(queue, ctx_, "virtio-vsock event", warn_, outcome);
        used_added_[event_queue] |= outcome.returned_malformed;
        broken_ |= outcome.broken;
        if (!chain)
            return;
        virtio_vsock_event ev{};
        ev.id = VIRTIO_VSOCK_EVENT_TRANSPORT_RESET;
        if (!all_writable(*chain, true) || chain_bytes(*chain) < sizeof(ev)) {
            guest_warn(warn_, "virtio-vsock: event chain {} unusable", chain->head);
            mark_used(event_queue, chain->head, 0);
            continue;
        }
        std::array<uint8_t, sizeof(ev)> raw{};
        std::memcpy(raw.data(), &ev, raw.size());
        // Before the guest can see the event: its refill afterwards must notify us.
        control_.event_delivered(queue.notify_on_next_buffer(mem));
        mark_used(event_queue, chain->head, static_cast<uint32_t>(scatter(mem, *chain, 0, raw)));
    }
}

// --- host side ---------------------------------------------------------------------------

bool VirtioVsock::connect(VsockConnId id)
{
    std::lock_guard lock(mutex());
    if (!active_ || broken_ || conns_.size() >= max_connections || find(id))
        return false;
    conns_.emplace(id, VsockConnection(VsockConnection::Phase::connecting));
    control_.push(id, VIRTIO_VSOCK_OP_REQUEST);
    pump();
    return true;
}

size_t VirtioVsock::send_budget(VsockConnId id) const
{
    std::lock_guard lock(mutex());
    const VsockConnection* conn = find(id);
    return conn ? conn->send_budget() : 0;
}

size_t VirtioVsock::send(VsockConnId id, std::span<const uint8_t> data)
{
    std::lock_guard lock(mutex());
    VsockConnection* conn = find(id);
    if (!conn)
        return 0;
    const size_t n = conn->enqueue(data);
    if (n > 0)
        pump();
    return n;
}

void VirtioVsock::consumed(VsockConnId id, size_t bytes)
{
    std::lock_guard lock(mutex());
    VsockConnection* conn = find(id);
    if (!conn)
        return;
    conn->forwarded(bytes);
    if (conn->credit_update_due())
        queue_credit_update(id, *conn);
    pump();
}

void VirtioVsock::shutdown(VsockConnId id, uint32_t flags)
{
    std::lock_guard lock(mutex());
    VsockConnection* conn = find(id);
    if (!conn || !conn->shut_local(flags))
        return;
    // Nothing to half-close yet: give up on the connection.
    if (conn->phase() == VsockConnection::Phase::connecting)
        drop_connection(id, true, false);
    pump();
}

void VirtioVsock::reset(VsockConnId id)
{
    std::lock_guard lock(mutex());
    if (!find(id))
        return;
    drop_connection(id, true, false);
    pump();
}

void VirtioVsock::send_transport_reset()
{
    std::lock_guard lock(mutex());
    control_.reset_transport();
    auto old = std::move(conns_);
    conns_.clear();
    for (const auto& [id, conn] : old)
        backend_.on_closed(id);
    pump();
}

bool VirtioVsock::has_connection(VsockConnId id) const
{
    std::lock_guard lock(mutex());
    return find(id) != nullptr;
}

size_t VirtioVsock::connection_count() const
{
    std::lock_guard lock(mutex());
    return conns_.size();
}

// --- snapshot ----------------------------------------------------------------------------

VirtioVsock::State VirtioVsock::save() const
{
    std::lock_guard lock(mutex());
    return {guest_cid_};
}

void VirtioVsock::restore(const State& state)
{
    std::lock_guard lock(mutex());
    if (!valid_guest_cid(state.guest_cid))
        throw Error(fmt::format("virtio-vsock: cannot restore: invalid guest CID {}", state.guest_cid));
    guest_cid_ = state.guest_cid;
}

} // namespace agentvm
