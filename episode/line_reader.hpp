// Reads JSON lines from an fd on the event loop (the harness's stdin, the agent's socket):
// bytes are read by an FdReader and split by LineFramer, so a line longer than the cap costs
// no memory.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "protocol/line_framer.hpp"
#include "core/fd_reader.hpp"

namespace agentvm {

class LineReader {
public:
    struct Handlers {
        std::function<void(std::string&& line)> on_line;  // without its '\n'
        std::function<void()> on_too_long;                // once per over-long line
        std::function<void(int err)> on_end;              // 0 at end-of-file, else errno
    };

    LineReader(EventLoop& loop, int fd, size_t max_line, Handlers handlers);
    LineReader(const LineReader&) = delete;
    LineReader& operator=(const LineReader&) = delete;

    void start() { reader_.start(); }
    // Optional: runs after each read that leaves a line unfinished, with what has arrived of
    // it (valid during the call). A long line still crossing is progress to a watchdog.
    void on_partial_line(std::function<void(std::string_view partial)> handler) { on_partial_ = std::move(handler); }
    // Backpressure: stop reading until resume() (lines already read are still delivered).
    void pause() { reader_.pause(); }
    void resume() { reader_.resume(); }
    bool ended() const { return reader_.ended(); }

private:
    void on_bytes(std::string_view bytes);
    void on_end(int err);

    Handlers handlers_;
    std::function<void(std::string_view)> on_partial_;
    LineFramer framer_;
    FdReader reader_;
};

} // namespace agentvm
