#include "devices/vsock_connection.hpp"

#include <algorithm>

namespace agentvm {

void VsockConnection::record_peer_credit(uint32_t peer_buf_alloc, uint32_t peer_fwd_cnt)
{
    c_.peer_buf_alloc = peer_buf_alloc;
    c_.peer_fwd_cnt = peer_fwd_cnt;
}

bool VsockConnection::accept_rx(uint32_t len)
{
    // The credit we advertised: what the guest may have in flight given the fwd_cnt it saw.
    const uint32_t used = c_.rx_cnt - c_.last_sent_fwd_cnt;
    if (used > buf_alloc || len > buf_alloc - used)
        return false;
    c_.rx_cnt += len;
    return true;
}

void VsockConnection::forwarded(size_t bytes)
{
    c_.fwd_cnt += static_cast<uint32_t>(std::min<size_t>(bytes, c_.rx_cnt - c_.fwd_cnt));
}

bool VsockConnection::credit_update_due() const
{
    if (c_.fwd_cnt == c_.last_sent_fwd_cnt)
        return false;  // nothing freed that the guest does not know about
    const uint32_t guest_view_used = c_.rx_cnt - c_.last_sent_fwd_cnt;
    const uint32_t guest_view_free = guest_view_used >= buf_alloc ? 0 : buf_alloc - guest_view_used;
    return guest_view_free < credit_update_threshold;
}

bool VsockConnection::want_credit_update()
{
    if (credit_update_queued_)
        return false;
    credit_update_queued_ = true;
    return true;
}

uint32_t VsockConnection::advertise(bool update)
{
    c_.last_sent_fwd_cnt = c_.fwd_cnt;
    if (update)
        credit_update_queued_ = false;
    return c_.fwd_cnt;
}

uint32_t VsockConnection::peer_credit() const
{
    // A guest that reports a fwd_cnt ahead of what we sent makes in_flight wrap huge: no credit.
    const uint32_t in_flight = c_.tx_cnt - c_.peer_fwd_cnt;
    return in_flight >= c_.peer_buf_alloc ? 0 : c_.peer_buf_alloc - in_flight;
}

size_t VsockConnection::send_budget() const
{
    if ((local_shutdown_ & VIRTIO_VSOCK_SHUTDOWN_SEND) || (peer_shutdown_ & VIRTIO_VSOCK_SHUTDOWN_RCV))
        return 0;
    return send_queue_cap - queued_;
}

size_t VsockConnection::enqueue(std::span<const uint8_t> data)
{
    const size_t n = std::min(data.size(), send_budget());
    if (n < data.size() || queued_ + n == send_queue_cap)
        send_blocked_ = true;
    if (n == 0)
        return 0;
    // Small sends share a chunk, so per-chunk overhead stays small next to the byte cap.
    const auto end = data.begin() + static_cast<ptrdiff_t>(n);
    if (!chunks_.empty() && chunks_.back().size() + n <= vsock_max_payload)
        chunks_.back().insert(chunks_.back().end(), data.begin(), end);
    else
        chunks_.emplace_back(data.begin(), end);
    queued_ += n;
    return n;
}

bool VsockConnection::deliverable() const
{
    if (phase_ != Phase::established)
        return false;
    if (queued_ > 0)
        return peer_credit() > 0;
    return local_shutdown_ != 0 && !shutdown_sent_;
}

std::vector<uint8_t> VsockConnection::take_payload(uint64_t room)
{
    const uint64_t n = std::min<uint64_t>({queued_, peer_credit(), vsock_max_payload, room});
    std::vector<uint8_t> payload(n);
    size_t done = 0;
    while (done < n) {
        auto& front = chunks_.front();
        const size_t take = std::min(front.size() - front_offset_, n - done);
        std::copy_n(front.begin() + static_cast<ptrdiff_t>(front_offset_), take,
                    payload.begin() + static_cast<ptrdiff_t>(done));
        done += take;
        front_offset_ += take;
        if (front_offset_ == front.size()) {
            chunks_.pop_front();
            front_offset_ = 0;
        }
    }
    queued_ -= n;
    c_.tx_cnt += static_cast<uint32_t>(n);
    return payload;
}

bool VsockConnection::take_send_space()
{
    if (!send_blocked_ || queued_ > send_queue_cap / 2)
        return false;
    send_blocked_ = false;
    return true;
}

bool VsockConnection::shut_local(uint32_t flags)
{
    flags &= vsock_shutdown_both;
    if (flags == 0 || (local_shutdown_ | flags) == local_shutdown_)
        return false;
    local_shutdown_ |= flags;
    shutdown_sent_ = false;
    return true;
}

uint32_t VsockConnection::take_shutdown()
{
    shutdown_sent_ = true;
    return local_shutdown_;
}

uint32_t VsockConnection::shut_peer(uint32_t flags)
{
    flags &= vsock_shutdown_both;
    peer_shutdown_ |= flags;
    if (flags & VIRTIO_VSOCK_SHUTDOWN_RCV) {
        // The guest reads no more: what we hold for it can never be delivered.
        chunks_.clear();
        front_offset_ = 0;
        queued_ = 0;
    }
    return flags;
}

} // namespace agentvm
