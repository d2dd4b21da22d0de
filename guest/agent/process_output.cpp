#include "guest/agent/process_output.hpp"

#include <algorithm>

namespace agentvm {

void OutputRing::append(const char* stream, std::string_view data)
{
    if (data.empty())
        return;
    chunks_.push_back({stream, end_, std::string(data)});
    end_ += data.size();
    while (!chunks_.empty() && end_ - chunks_.front().offset > limit_) {
        chunks_.pop_front();
        start_ = chunks_.empty() ? end_ : chunks_.front().offset;
    }
}

std::vector<OutputChunk> OutputRing::read(uint64_t& cursor, size_t max_bytes) const
{
    std::vector<OutputChunk> out;
    // The chunk holding `cursor`: chunks are in offset order.
    auto it = std::upper_bound(chunks_.begin(), chunks_.end(), cursor,
                               [](uint64_t offset, const OutputChunk& chunk) { return offset < chunk.offset; });
    if (it != chunks_.begin())
        --it;
    size_t taken = 0;
    for (; it != chunks_.end() && (out.empty() || taken < max_bytes); ++it) {
        if (it->offset + it->data.size() <= cursor)
            continue;
        const size_t skip = static_cast<size_t>(cursor - std::min(cursor, it->offset));
        out.push_back({it->stream, it->offset + skip, it->data.substr(skip)});
        taken += out.back().data.size();
        cursor = it->offset + it->data.size();
    }
    return out;
}

} // namespace agentvm
