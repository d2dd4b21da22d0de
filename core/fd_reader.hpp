// Reads an fd on the event loop without ever blocking: each time it polls readable, one
// read(2) of up to 256 KiB is handed on. The one place the host side of a stream (the
// harness's stdin, the agent's socket) is read; what the bytes mean is the caller's.
#pragma once

#include <functional>
#include <string_view>

#include "core/event_loop.hpp"

namespace agentvm {

class FdReader {
public:
    struct Handlers {
        std::function<void(std::string_view bytes)> on_bytes;  // valid during the call
        std::function<void(int err)> on_end;  // once: 0 at end-of-file, else errno
    };

    FdReader(EventLoop& loop, int fd, Handlers handlers);
    ~FdReader();
    FdReader(const FdReader&) = delete;
    FdReader& operator=(const FdReader&) = delete;

    void start();
    // Backpressure: no read until resume().
    void pause();
    void resume();
    // Reads no more, and on_end is not called.
    void stop();
    bool ended() const { return ended_; }

private:
    void on_readable();

    EventLoop& loop_;
    int fd_;
    Handlers handlers_;
    bool watching_ = false;
    bool paused_ = false;
    bool ended_ = false;  // end-of-file, an error, or stop()
};

} // namespace agentvm
