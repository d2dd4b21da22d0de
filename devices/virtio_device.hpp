// What a virtio device (blk, vsock, …) offers its transport (virtio 1.2 §2, §4.2).
//
// The transport (virtio_mmio.hpp) owns the registers, the status state machine and the
// virtqueues; the device owns its config space and what its queues carry. The transport
// calls every method below with mutex() held, and a device takes mutex() itself before
// touching queues from its own callbacks (I/O completions), so register writes on vCPU
// threads, queue processing and completions on the event-loop thread never interleave.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/warn_limiter.hpp"
#include "devices/virtqueue.hpp"
#include "core/guest_memory.hpp"

namespace agentvm {

// What the transport hands a device when the driver sets DRIVER_OK.
struct VirtioContext {
    const GuestMemory* mem = nullptr;
    std::span<Virtqueue> queues;  // owned by the transport; stable until it is destroyed
    uint64_t features = 0;        // negotiated
    // Call after adding used elements when Virtqueue::should_notify() said so: sets
    // InterruptStatus bit 0 and raises the interrupt. Needs mutex() held.
    std::function<void()> signal_used;
    // Call when a queue is broken beyond one chain (Virtqueue::pop threw GuestError): sets
    // DEVICE_NEEDS_RESET and raises a config interrupt (§2.1.2). Needs mutex() held.
    std::function<void()> needs_reset;
};

class VirtioDevice {
public:
    virtual ~VirtioDevice() = default;

    virtual uint32_t device_type() const = 0;      // VIRTIO_ID_*
    virtual uint64_t device_features() const = 0;  // must include VIRTIO_F_VERSION_1
    virtual size_t queue_count() const = 0;
    virtual uint16_t queue_max_size(size_t index) const = 0;

    // Device-specific config space (§4.2.2: at 0x100 of the MMIO window). Bytes beyond the
    // config structure read as zero; writes the device does not accept are ignored.
    virtual void read_config(uint64_t offset, std::span<uint8_t> data) const = 0;
    virtual void write_config(uint64_t offset, std::span<const uint8_t> data) = 0;

    // DRIVER_OK was set: queues that are ready() may be used from now on.
    virtual void activate(const VirtioContext& ctx) = 0;
    // The driver notified queue `index` (ioeventfd or QueueNotify). Runs on the loop thread.
    virtual void process_queue(size_t index) = 0;
    // The driver wrote 0 to Status: forget the context; I/O still in flight must not touch
    // the queues when it completes.
    virtual void reset() = 0;

    // The one lock shared by the device and its transport. Recursive because an event-loop
    // submission may run completions inline, which lock again on the same thread.
    std::recursive_mutex& mutex() const { return mutex_; }

private:
    mutable std::recursive_mutex mutex_;
};

// What took_chain() met besides the chain it returns.
struct PopOutcome {
    bool returned_malformed = false;  // a malformed chain went back to the driver (used, len 0)
    bool broken = false;              // the ring is unusable: DEVICE_NEEDS_RESET was set
};

// The next well-formed chain of `queue`, for a device's queue handler (mutex() held). A
// malformed chain goes back to the driver unused, with a warning, and the next is tried: one
// bad request fails alone. A broken ring (Virtqueue::pop's GuestError) warns, sets
// DEVICE_NEEDS_RESET through ctx and ends the walk: only a reset recovers it. nullopt when
// the ring is empty or broken; `outcome` says which, and whether used elements were added.
std::optional<DescriptorChain> take_chain(Virtqueue& queue, const VirtioContext& ctx, std::string_view queue_name,
                                          WarnLimiter& warn, PopOutcome& outcome);

// Serves a driver's read of `out.size()` bytes at `offset` in a device's config space: the
// part inside the struct is copied, anything past its end reads as zero.
template <typename Config>
void read_config_struct(const Config& config, uint64_t offset, std::span<uint8_t> out)
{
    static_assert(std::is_trivially_copyable_v<Config>);
    std::array<uint8_t, sizeof(Config)> bytes{};
    std::memcpy(bytes.data(), &config, sizeof(Config));
    std::fill(out.begin(), out.end(), uint8_t{0});
    if (offset >= bytes.size())
        return;
    const size_t n = std::min<uint64_t>(out.size(), bytes.size() - offset);
    std::copy_n(bytes.begin() + static_cast<ptrdiff_t>(offset), n, out.begin());
}

} // namespace agentvm
