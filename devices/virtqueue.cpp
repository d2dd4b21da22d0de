#include "devices/virtqueue.hpp"

// The legacy part of virtio_ring.h (vring_init) is not valid C++; we need none of it.
#ifndef VIRTIO_RING_NO_LEGACY
#define VIRTIO_RING_NO_LEGACY
#endif
#include <linux/virtio_ring.h>

#include <atomic>
#include <bit>
#include <fmt/format.h>

namespace agentvm {

namespace {

// Offsets inside the rings (§2.7.6, §2.7.8). Written out because <linux/virtio_ring.h>
// describes them with flexible arrays, which C++ cannot size.
constexpr uint64_t avail_idx_offset = offsetof(vring_avail, idx);
constexpr uint64_t avail_ring_offset = offsetof(vring_avail, ring);
constexpr uint64_t used_idx_offset = offsetof(vring_used, idx);
constexpr uint64_t used_ring_offset = offsetof(vring_used, ring);
static_assert(sizeof(vring_desc) == 16 && sizeof(vring_used_elem) == 8);
static_assert(avail_ring_offset == 4 && used_ring_offset == 4);
static_assert(std::endian::native == std::endian::little,
              "virtio 1.x rings are little-endian; agentvm reads them natively");

bool valid_size(uint16_t size, uint16_t max_size)
{
    return size != 0 && size <= max_size && std::has_single_bit(size);
}

} // namespace

Virtqueue::Virtqueue(uint16_t max_size) : max_size_(max_size), size_(max_size)
{
    if (!valid_size(max_size, 32768))
        throw Error(fmt::format("virtqueue max size {} is not a power of two in 1..32768", max_size));
}

void Virtqueue::reset()
{
    *this = Virtqueue(max_size_);
}

void Virtqueue::validate_layout(const GuestMemory& mem) const
{
    if (!valid_size(size_, max_size_))
        throw GuestError(fmt::format("queue size {} is not a power of two in 1..{}", size_, max_size_));
    struct Part {
        const char* name;
        uint64_t addr;
        uint64_t bytes;
        uint64_t align;
    };
    const Part parts[] = {
        {"descriptor table", desc_addr_, desc_table_bytes(size_), VRING_DESC_ALIGN_SIZE},
        {"available ring", avail_addr_, avail_ring_bytes(size_), VRING_AVAIL_ALIGN_SIZE},
        {"used ring", used_addr_, used_ring_bytes(size_), VRING_USED_ALIGN_SIZE},
    };
    for (const Part& p : parts) {
        if (p.addr % p.align != 0)
            throw GuestError(fmt::format("{} at {:#x} is not {}-byte aligned", p.name, p.addr, p.align));
        if (!mem.contains(p.addr, p.bytes))
            throw GuestError(fmt::format("{} [{:#x}, +{:#x}) is outside RAM", p.name, p.addr, p.bytes));
    }
}

void Virtqueue::enable(const GuestMemory& mem)
{
    validate_layout(mem);
    ready_ = true;
}

uint16_t Virtqueue::read_avail_idx(const GuestMemory& mem) const
{
    const auto idx = mem.read_obj<uint16_t>(avail_addr_ + avail_idx_offset);
    // The driver writes ring entries before idx (§2.7.13.3); do not read entries before idx.
    std::atomic_thread_fence(std::memory_order_acquire);
    return idx;
}

void Virtqueue::publish_avail_event(const GuestMemory& mem, uint16_t event)
{
    // avail_event sits right after the used ring's entries (§2.7.8).
    mem.write_obj<uint16_t>(used_addr_ + used_ring_offset + 8ull * size_, event);
    // Store avail_event, then load avail->idx: a store→load pair, so it needs a full fence;
    // otherwise the driver could miss our event and we its new buffer.
    std::atomic_thread_fence(std::memory_order_seq_cst);
}

uint16_t Virtqueue::notify_on_next_buffer(const GuestMemory& mem)
{
    const uint16_t idx = read_avail_idx(mem);
    if (ready_ && event_idx_)
        publish_avail_event(mem, idx);
    return idx;
}

std::optional<DescriptorChain> Virtqueue::pop(const GuestMemory& mem)
{
    if (!ready_)
        return std::nullopt;

    uint16_t avail_idx = read_avail_idx(mem);
    if (avail_idx == next_avail_ && event_idx_) {
        publish_avail_event(mem, next_avail_);
        avail_idx = read_avail_idx(mem);
    }
    const auto pending = static_cast<uint16_t>(avail_idx - next_avail_);
    if (pending > size_)
        throw GuestError(fmt::format("driver moved avail idx from {} to {}, more than the queue size {}",
                                     next_avail_, avail_idx, size_));
    if (pending == 0)
        return std::nullopt;

    const uint64_t slot = next_avail_ & (size_ - 1u);
    const auto head = mem.read_obj<uint16_t>(avail_addr_ + avail_ring_offset + 2 * slot);
    ++next_avail_;
    return read_chain(mem, head);
}

DescriptorChain Virtqueue::read_chain(const GuestMemory& mem, uint16_t head) const
{
    DescriptorChain chain{head, {}};
    if (head >= size_)
        throw ChainError(head, fmt::format("chain head {} is outside the queue of size {}", head, size_));

    uint16_t index = head;
    bool seen_writable = false;
    for (;;) {
        // A chain visits at most size_ descriptors; more means the guest built a cycle.
        if (chain.descriptors.size() == size_)
            throw ChainError(head, fmt::format("chain at {} is longer than the queue size {}", head, size_));
        const auto desc = mem.read_obj<vring_desc>(desc_addr_ + 16ull * index);
        if (desc.flags & VRING_DESC_F_INDIRECT)
            throw ChainError(head, fmt::format("chain at {} uses an indirect descriptor, which was not offered",
                                               head));
        if (!mem.contains(desc.addr, desc.len))
            throw ChainError(head, fmt::format("descriptor {} of chain {}: buffer [{:#x}, +{:#x}) is outside RAM",
                                               index, head, desc.addr, desc.len));
        const bool writable = desc.flags & VRING_DESC_F_WRITE;
        // §2.7.4.2: device-readable buffers come first. Enforcing it here spares every device
        // from checking the shape of the chain twice.
        if (seen_writable && !writable)
            throw ChainError(head, fmt::format("chain at {} has a readable descriptor after a writable one", head));
        seen_writable = writable;
        chain.descriptors.push_back({desc.addr, desc.len, writable});
        if (!(desc.flags & VRING_DESC_F_NEXT))
            return chain;
        if (desc.next >= size_)
            throw ChainError(head, fmt::format("descriptor {} of chain {} links to {}, outside the queue",
                                               index, head, desc.next));
        index = desc.next;
    }
}

void Virtqueue::add_used(const GuestMemory& mem, uint16_t head, uint32_t len)
{
    const uint64_t slot = next_used_ & (size_ - 1u);
    const vring_used_elem elem{head, len};
    mem.write_obj(used_addr_ + used_ring_offset + 8 * slot, elem);
    // The element must be visible before the index that publishes it (§2.7.8.2).
    std::atomic_thread_fence(std::memory_order_release);
    ++next_used_;
    mem.write_obj<uint16_t>(used_addr_ + used_idx_offset, next_used_);
}

bool Virtqueue::should_notify(const GuestMemory& mem)
{
    // Our used->idx store must be visible before we read the driver's suppression fields
    // (store→load), or the driver may sleep on an interrupt we decided to skip.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const uint16_t old = signalled_used_;
    signalled_used_ = next_used_;
    if (!event_idx_) {
        const auto flags = mem.read_obj<uint16_t>(avail_addr_ + offsetof(vring_avail, flags));
        return old != next_used_ && !(flags & VRING_AVAIL_F_NO_INTERRUPT);
    }
    // used_event sits right after the available ring's entries (§2.7.7).
    const auto used_event = mem.read_obj<uint16_t>(avail_addr_ + avail_ring_offset + 2ull * size_);
    return vring_need_event(used_event, next_used_, old);
}

Virtqueue::State Virtqueue::save() const
{
    return {size_, ready_, event_idx_, desc_addr_, avail_addr_, used_addr_,
            next_avail_, next_used_, signalled_used_};
}

void Virtqueue::restore(const State& s, const GuestMemory& mem)
{
    // A queue the driver never enabled may hold any QueueNum it wrote (enable refuses a bad
    // one): such a state is still what save() gave, and must restore.
    if (s.ready && !valid_size(s.size, max_size_))
        throw Error(fmt::format("virtqueue state: size {} is not a power of two in 1..{}", s.size, max_size_));
    if (s.ready && static_cast<uint16_t>(s.next_avail - s.next_used) > s.size)
        throw Error(fmt::format("virtqueue state: {} chains in flight exceed the queue size {}",
                                static_cast<uint16_t>(s.next_avail - s.next_used), s.size));
    Virtqueue q(max_size_);
    q.size_ = s.size;
    q.ready_ = false;
    q.event_idx_ = s.event_idx;
    q.desc_addr_ = s.desc_addr;
    q.avail_addr_ = s.avail_addr;
    q.used_addr_ = s.used_addr;
    q.next_avail_ = s.next_avail;
    q.next_used_ = s.next_used;
    q.signalled_used_ = s.signalled_used;
    if (s.ready) {
        try {
            q.enable(mem);
        } catch (const GuestError& e) {
            throw Error(fmt::format("virtqueue state: {}", e.what()));
        }
    }
    *this = q;
}

} // namespace agentvm
