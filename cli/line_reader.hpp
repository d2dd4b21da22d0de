// Reads JSON lines from an fd on the event loop (the harness's stdin, the agent's socket):
// bytes are read as the fd polls readable and split by LineFramer, so a line longer than
// the cap costs no memory. The fd is read with plain read(2) after poll, never blocking.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "protocol/line_framer.hpp"
#include "core/event_loop.hpp"

namespace agentvm {

class LineReader {
public:
    struct Handlers {
        std::function<void(std::string&& line)> on_line;  // without its '\n'
        std::function<void()> on_too_long;                // once per over-long line
        std::function<void(int err)> on_end;              // 0 at end-of-file, else errno
    };

    LineReader(EventLoop& loop, int fd, size_t max_line, Handlers handlers);
    ~LineReader();
    LineReader(const LineReader&) = delete;
    LineReader& operator=(const LineReader&) = delete;

    void start();
    // Optional: runs after each read that leaves a line unfinished, with what has arrived of
    // it (valid during the call). A long line still crossing is progress to a watchdog.
    void on_partial_line(std::function<void(std::string_view partial)> handler) { on_partial_ = std::move(handler); }
    // Backpressure: stop reading until resume() (lines already read are still delivered).
    void pause();
    void resume();
    bool ended() const { return ended_; }

private:
    void on_readable();

    EventLoop& loop_;
    int fd_;
    Handlers handlers_;
    std::function<void(std::string_view)> on_partial_;
    LineFramer framer_;
    bool watching_ = false;
    bool paused_ = false;
    bool ended_ = false;
};

} // namespace agentvm
