#include "protocol/line_framer.hpp"

#include <utility>

namespace agentvm {

LineFramer::LineFramer(size_t max_line, std::function<void(std::string&&)> on_line,
    std::function<void()> on_too_long)
    : max_line_(max_line), on_line_(std::move(on_line)), on_too_long_(std::move(on_too_long))
{
}

void LineFramer::feed(std::string_view bytes)
{
    while (!bytes.empty()) {
        const size_t newline = bytes.find('\n');
        const std::string_view piece = bytes.substr(0, newline);
        if (!skipping_) {
            if (partial_.size() + piece.size() > max_line_) {
                skipping_ = true;
                std::string().swap(partial_);
                on_too_long_();
            } else {
                partial_.append(piece);
            }
        }
        if (newline == std::string_view::npos)
            return;
        bytes.remove_prefix(newline + 1);
        if (skipping_)
            skipping_ = false;
        else
            on_line_(std::exchange(partial_, {}));
    }
}

void LineFramer::finish()
{
    if (!skipping_ && !partial_.empty())
        on_line_(std::exchange(partial_, {}));
    partial_.clear();
    skipping_ = false;
}

} // namespace agentvm
