#include "devices/vsock_control.hpp"

#include <algorithm>

namespace agentvm {

void VsockControl::push(VsockConnId id, uint16_t op, uint64_t src_cid)
{
    replies_.push_back({id, op, src_cid});
}

std::optional<VsockReply> VsockControl::pop()
{
    if (replies_.empty())
        return std::nullopt;
    const VsockReply reply = replies_.front();
    replies_.pop_front();
    return reply;
}

void VsockControl::forget(VsockConnId id)
{
    std::erase_if(replies_, [&](const VsockReply& r) { return r.id == id && r.src_cid == vsock_host_cid; });
}

void VsockControl::reset_transport()
{
    replies_.clear();
    event_pending_ = true;
    reset_avail_.reset();
}

void VsockControl::event_delivered(uint16_t avail_idx)
{
    event_pending_ = false;
    reset_avail_ = avail_idx;
}

void VsockControl::clear()
{
    replies_.clear();
    event_pending_ = false;
    reset_avail_.reset();
}

} // namespace agentvm
