#include "devices/virtio_device.hpp"

namespace agentvm {

std::optional<DescriptorChain> take_chain(Virtqueue& queue, const VirtioContext& ctx, std::string_view queue_name,
                                          WarnLimiter& warn, PopOutcome& outcome)
{
    for (;;) {
        try {
            return queue.pop(*ctx.mem);
        } catch (const ChainError& e) {
            guest_warn(warn, "{}: malformed chain: {}", queue_name, e.what());
            queue.add_used(*ctx.mem, e.head(), 0);
            outcome.returned_malformed = true;
        } catch (const GuestError& e) {
            guest_warn(warn, "{}: queue broken, device needs reset: {}", queue_name, e.what());
            outcome.broken = true;
            ctx.needs_reset();
            return std::nullopt;
        }
    }
}

} // namespace agentvm
