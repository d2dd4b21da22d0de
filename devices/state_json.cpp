#include "devices/state_json.hpp"

#include <linux/virtio_config.h>
#include <linux/virtio_vsock.h>
// The legacy part of virtio_ring.h (vring_init) is not valid C++; we need none of it.
#ifndef VIRTIO_RING_NO_LEGACY
#define VIRTIO_RING_NO_LEGACY
#endif
#include <linux/virtio_ring.h>

#include <algorithm>
#include <concepts>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "common/error.hpp"

namespace agentvm {

using nlohmann::json;
using namespace state_codec;

namespace {

// --- virtio-vsock pieces ------------------------------------------------------------------

using ConnState = VirtioVsock::ConnState;

constexpr std::pair<ConnState, std::string_view> conn_state_names[] = {
    {ConnState::connecting, "connecting"},
    {ConnState::established, "established"},
};

std::string_view conn_state_name(ConnState state)
{
    for (const auto& [value, name] : conn_state_names)
        if (value == state)
            return name;
    return "invalid";  // restore() refuses it; save() never makes it
}

// The replies the device queues: SHUTDOWN and data go out from their connection instead.
constexpr std::pair<uint16_t, std::string_view> queued_ops[] = {
    {VIRTIO_VSOCK_OP_REQUEST, "REQUEST"},
    {VIRTIO_VSOCK_OP_RESPONSE, "RESPONSE"},
    {VIRTIO_VSOCK_OP_RST, "RST"},
    {VIRTIO_VSOCK_OP_CREDIT_UPDATE, "CREDIT_UPDATE"},
};

// Empty for an op the device never queues.
std::string_view queued_op_name(uint16_t op)
{
    for (const auto& [value, name] : queued_ops)
        if (value == op)
            return name;
    return {};
}

json conn_id_json(VsockConnId id)
{
    return {{"host_port", id.host_port}, {"guest_port", id.guest_port}};
}

VsockConnId parse_conn_id(const json& j, std::string_view path)
{
    Fields f(j, path);
    VsockConnId id;
    id.host_port = f.uint<uint32_t>("host_port");
    id.guest_port = f.uint<uint32_t>("guest_port");
    f.done();
    return id;
}

ConnState parse_conn_state(const json& j, std::string_view path)
{
    if (!j.is_string())
        fail(path, fmt::format("expected a string, got {}", describe(j)));
    const auto& text = j.get_ref<const std::string&>();
    for (const auto& [value, name] : conn_state_names)
        if (text == name)
            return value;
    fail(path, fmt::format("unknown state \"{}\"", printable(text)));
}

json connection_json(const VirtioVsock::ConnectionState& c)
{
    return {
        {"id", conn_id_json(c.id)},
        {"state", conn_state_name(c.state)},
        {"local_shutdown", c.local_shutdown},
        {"peer_shutdown", c.peer_shutdown},
        {"shutdown_sent", c.shutdown_sent},
        {"credit_update_queued", c.credit_update_queued},
        {"send_blocked", c.send_blocked},
        {"rx_cnt", c.rx_cnt},
        {"fwd_cnt", c.fwd_cnt},
        {"last_sent_fwd_cnt", c.last_sent_fwd_cnt},
        {"tx_cnt", c.tx_cnt},
        {"peer_buf_alloc", c.peer_buf_alloc},
        {"peer_fwd_cnt", c.peer_fwd_cnt},
        {"pending", json::binary(c.pending)},
    };
}

VirtioVsock::ConnectionState parse_connection(const json& j, std::string_view path)
{
    Fields f(j, path);
    VirtioVsock::ConnectionState c;
    c.id = parse_conn_id(f.at("id"), f.path("id"));
    c.state = parse_conn_state(f.at("state"), f.path("state"));
    c.local_shutdown = f.uint<uint32_t>("local_shutdown");
    c.peer_shutdown = f.uint<uint32_t>("peer_shutdown");
    c.shutdown_sent = f.boolean("shutdown_sent");
    c.credit_update_queued = f.boolean("credit_update_queued");
    c.send_blocked = f.boolean("send_blocked");
    c.rx_cnt = f.uint<uint32_t>("rx_cnt");
    c.fwd_cnt = f.uint<uint32_t>("fwd_cnt");
    c.last_sent_fwd_cnt = f.uint<uint32_t>("last_sent_fwd_cnt");
    c.tx_cnt = f.uint<uint32_t>("tx_cnt");
    c.peer_buf_alloc = f.uint<uint32_t>("peer_buf_alloc");
    c.peer_fwd_cnt = f.uint<uint32_t>("peer_fwd_cnt");
    c.pending = f.bytes("pending");
    f.done();

    // restore() checks the shutdown bits, the send queue against its cap, the receive counters
    // against the credit we advertise (which bounds what the backend holds), and
    // credit_update_queued against the reply queue. What it assumes:
    if (c.state == ConnState::connecting) {
        // Until the guest's RESPONSE only our REQUEST has passed: any other packet from the
        // guest drops the connection, so does the host's shutdown(), and nothing is delivered.
        const std::pair<std::string_view, uint32_t> untouched[] = {
            {"local_shutdown", c.local_shutdown},
            {"peer_shutdown", c.peer_shutdown},
            {"shutdown_sent", c.shutdown_sent},
            {"credit_update_queued", c.credit_update_queued},
            {"rx_cnt", c.rx_cnt},
            {"fwd_cnt", c.fwd_cnt},
            {"last_sent_fwd_cnt", c.last_sent_fwd_cnt},
            {"tx_cnt", c.tx_cnt},
            {"peer_buf_alloc", c.peer_buf_alloc},
            {"peer_fwd_cnt", c.peer_fwd_cnt},
        };
        for (const auto& [name, value] : untouched)
            if (value != 0)
                fail(f.path(name), fmt::format("{} on a connection still connecting, which has exchanged nothing",
                                               value));
    }
    // The guest shutting down both directions makes the device answer RST and drop the connection.
    if (c.peer_shutdown == vsock_shutdown_both)
        fail(f.path("peer_shutdown"), "the guest shut down both directions, yet the connection is live");
    // Its SHUTDOWN(RCV) dropped what waited for it, and send() takes nothing afterwards.
    if ((c.peer_shutdown & VIRTIO_VSOCK_SHUTDOWN_RCV) && !c.pending.empty())
        fail(f.path("pending"), fmt::format("{} bytes wait for a guest that shut down receiving", c.pending.size()));
    if (c.shutdown_sent && c.local_shutdown == 0)
        fail(f.path("shutdown_sent"), "set, yet the host shut nothing down");
    return c;
}

json control_json(const VirtioVsock::ControlState& c)
{
    return {{"id", conn_id_json(c.id)}, {"op", c.op}, {"flags", c.flags}, {"src_cid", c.src_cid}};
}

VirtioVsock::ControlState parse_control(const json& j, std::string_view path)
{
    Fields f(j, path);
    VirtioVsock::ControlState c;
    c.id = parse_conn_id(f.at("id"), f.path("id"));
    c.op = f.uint<uint16_t>("op");
    c.flags = f.uint<uint32_t>("flags");
    c.src_cid = f.uint<uint64_t>("src_cid");
    f.done();

    // restore() takes any known op with shutdown flags, and checks that only an RST comes from
    // a CID other than the host's. The device queues four ops, never with flags.
    if (queued_op_name(c.op).empty())
        fail(f.path("op"), fmt::format("{} is not a reply the device queues", c.op));
    if (c.flags != 0)
        fail(f.path("flags"), fmt::format("{:#x} on a {}, which carries none", c.flags, queued_op_name(c.op)));
    return c;
}

} // namespace

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
    json connections = json::array();
    for (const auto& c : s.connections)
        connections.push_back(connection_json(c));
    json control = json::array();
    for (const auto& c : s.control)
        control.push_back(control_json(c));
    j = {
        {"guest_cid", s.guest_cid},
        {"connections", std::move(connections)},
        {"control", std::move(control)},
        {"event_pending", s.event_pending},
        {"reset_avail", s.reset_avail ? json(*s.reset_avail) : json(nullptr)},
    };
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
    const std::string connections_path = f.path("connections");
    const json& connections = f.array("connections");
    for (size_t i = 0; i < connections.size(); ++i)
        s.connections.push_back(parse_connection(connections[i], element(connections_path, i)));
    const std::string control_path = f.path("control");
    const json& control = f.array("control");
    for (size_t i = 0; i < control.size(); ++i)
        s.control.push_back(parse_control(control[i], element(control_path, i)));
    s.event_pending = f.boolean("event_pending");
    s.reset_avail = f.optional_uint<uint16_t>("reset_avail");
    f.done();

    // restore() checks the CID, the counts, that connections are sorted and unique, and that
    // each connection's credit_update_queued matches the reply queue. What it assumes: the
    // replies other than RST belong to a live connection (dropping one drops its replies),
    // one of each kind at most.
    std::map<VsockConnId, ConnState> state_of;
    for (const auto& c : s.connections)
        state_of.emplace(c.id, c.state);  // duplicates are restore()'s to refuse
    std::set<std::pair<VsockConnId, bool>> seen;  // (id, is CREDIT_UPDATE)
    for (size_t i = 0; i < s.control.size(); ++i) {
        const VirtioVsock::ControlState& q = s.control[i];
        if (q.op == VIRTIO_VSOCK_OP_RST || q.src_cid != vsock_host_cid)
            continue;  // an RST may name any port pair; restore() refuses other foreign CIDs
        const auto where = element(control_path, i);
        const auto it = state_of.find(q.id);
        if (it == state_of.end())
            fail(where, fmt::format("{} for connection {}:{}, which does not exist", queued_op_name(q.op), q.id.host_port,
                                    q.id.guest_port));
        // A guest that answers before our REQUEST reached it leaves the REQUEST queued on an
        // established connection; a RESPONSE only ever follows the guest's own REQUEST.
        if (q.op == VIRTIO_VSOCK_OP_RESPONSE && it->second != ConnState::established)
            fail(where, fmt::format("RESPONSE for connection {}:{}, which is still connecting", q.id.host_port,
                                    q.id.guest_port));
        // A connection opens once (REQUEST or RESPONSE) and has one CREDIT_UPDATE queued at most.
        if (!seen.emplace(q.id, q.op == VIRTIO_VSOCK_OP_CREDIT_UPDATE).second)
            fail(where, fmt::format("a second {} for connection {}:{}",
                                    q.op == VIRTIO_VSOCK_OP_CREDIT_UPDATE ? "CREDIT_UPDATE" : "REQUEST or RESPONSE",
                                    q.id.host_port, q.id.guest_port));
    }
    return s;
}

} // namespace agentvm
