// A one-shot timer on the event loop (a timerfd it watches): retry delays and watchdogs
// run their callback on the loop's thread like every other event.
#pragma once

#include <chrono>
#include <functional>

#include "core/event_loop.hpp"
#include "common/fd.hpp"

namespace agentvm {

class LoopTimer {
public:
    LoopTimer(EventLoop& loop, std::function<void()> on_expiry);
    ~LoopTimer();
    LoopTimer(const LoopTimer&) = delete;
    LoopTimer& operator=(const LoopTimer&) = delete;

    // (Re)starts the timer: on_expiry runs once, `after` from now, unless cancelled first.
    void arm(std::chrono::nanoseconds after);
    void cancel();

private:
    EventLoop& loop_;
    Fd fd_;
    std::function<void()> on_expiry_;
    bool armed_ = false;  // spares a syscall per cancel() of an idle timer (every tool call)
};

} // namespace agentvm
