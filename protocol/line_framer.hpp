// Splits a byte stream into newline-terminated lines without ever buffering more than the
// cap: a line that outgrows it is reported once and its remaining bytes are skipped up to
// the next newline, so a runaway sender costs the agent no memory.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace agentvm {

class LineFramer {
public:
    // on_line gets each complete line without its '\n'; on_too_long is called once per
    // over-long line, as soon as it passes the cap.
    LineFramer(size_t max_line, std::function<void(std::string&&)> on_line,
        std::function<void()> on_too_long);

    void feed(std::string_view bytes);
    // End of stream: a last line without '\n' still counts as a line.
    void finish();
    // What has arrived of the line not yet ended ("" while an over-long one is skipped).
    std::string_view partial() const { return partial_; }

private:
    size_t max_line_;
    std::function<void(std::string&&)> on_line_;
    std::function<void()> on_too_long_;
    std::string partial_;
    bool skipping_ = false;
};

} // namespace agentvm
