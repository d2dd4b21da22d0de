// For unit tests of a server on an EventLoop: runs the loop while a client thread does its
// work, and stops it once the client is done.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>

#include "core/event_loop.hpp"
#include "core/loop_timer.hpp"

namespace agentvm::test {

inline void run_loop_with_client(EventLoop& loop, const std::function<void()>& client_work)
{
    std::atomic<bool> done = false;
    std::thread client([&] {
        client_work();
        done = true;
    });
    std::unique_ptr<LoopTimer> poll;
    poll = std::make_unique<LoopTimer>(loop, [&] {
        if (done)
            return loop.stop();
        poll->arm(std::chrono::milliseconds(5));
    });
    poll->arm(std::chrono::milliseconds(5));
    loop.run();
    client.join();
}

} // namespace agentvm::test
