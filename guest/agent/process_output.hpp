// What a registered process has written (stdout, stderr, or its pty), kept in order up to a
// bound for those who attach late, each byte at its offset in the whole output: a reader
// follows by offset, and learns how much it missed when it falls behind what is kept.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace agentvm {

struct OutputChunk {
    const char* stream;  // "stdout", "stderr" or "pty"
    uint64_t offset;     // of its first byte in the whole output
    std::string data;
};

class OutputRing {
public:
    explicit OutputRing(uint64_t limit) : limit_(limit) {}

    // Keeps `data`, dropping the oldest chunks while more than the limit is kept.
    void append(const char* stream, std::string_view data);
    // Offsets of the oldest byte kept and of the byte after the newest.
    uint64_t start() const { return start_; }
    uint64_t end() const { return end_; }
    // Whole chunks from `cursor` (at or after start()) on, about `max_bytes` of them at most
    // (at least one when there is one); advances `cursor` past them.
    std::vector<OutputChunk> read(uint64_t& cursor, size_t max_bytes) const;

private:
    uint64_t limit_;
    uint64_t start_ = 0;
    uint64_t end_ = 0;
    std::deque<OutputChunk> chunks_;
};

} // namespace agentvm
