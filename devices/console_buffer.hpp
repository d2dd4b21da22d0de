// The serial console's output on its way to the host: a bounded queue of the bytes the guest
// transmitted that are not written out yet. Pure: no fds, no locks, never waits. A reader
// who stops reading costs the guest its console output beyond the bound, never its progress.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace agentvm {

class ConsoleBuffer {
public:
    explicit ConsoleBuffer(size_t capacity) : capacity_(capacity) {}

    // Queues byte, or counts it as dropped when the buffer is full. True when this byte is
    // the first one dropped since output was last taken: a new burst of loss begins.
    bool push(uint8_t byte);
    // Removes and returns up to max of the oldest bytes. Taking anything ends a burst of loss.
    std::string take(size_t max);

    size_t size() const { return bytes_.size(); }
    size_t capacity() const { return capacity_; }
    // Bytes dropped so far, in all.
    uint64_t dropped() const { return dropped_; }

private:
    size_t capacity_;
    std::string bytes_;
    uint64_t dropped_ = 0;
    bool dropping_ = false;
};

} // namespace agentvm
