#include "devices/console_buffer.hpp"

#include <algorithm>

namespace agentvm {

bool ConsoleBuffer::push(uint8_t byte)
{
    if (bytes_.size() < capacity_) {
        bytes_.push_back(static_cast<char>(byte));
        return false;
    }
    ++dropped_;
    const bool burst_begins = !dropping_;
    dropping_ = true;
    return burst_begins;
}

std::string ConsoleBuffer::take(size_t max)
{
    const size_t n = std::min(max, bytes_.size());
    std::string out = bytes_.substr(0, n);
    bytes_.erase(0, n);
    if (n > 0)
        dropping_ = false;
    return out;
}

} // namespace agentvm
