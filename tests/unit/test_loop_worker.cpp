#include <doctest/doctest.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "core/event_loop.hpp"
#include "core/loop_timer.hpp"
#include "core/loop_worker.hpp"

using namespace agentvm;

namespace {

std::string message(std::exception_ptr failure)
{
    try {
        std::rethrow_exception(failure);
    } catch (const std::exception& e) {
        return e.what();
    }
}

} // namespace

TEST_CASE("work runs on the worker, in order, and done on the loop's thread with what it threw")
{
    EventLoop loop;
    LoopWorker worker(loop, [] {});
    const auto loop_thread = std::this_thread::get_id();
    std::vector<std::string> seen;
    std::atomic<bool> off_loop{true};
    for (int i = 0; i < 3; ++i)
        worker.post([&, i] {
            if (std::this_thread::get_id() == loop_thread)
                off_loop = false;
            if (i == 1)
                throw Error("job 1 failed");
        },
                    [&, i](std::exception_ptr failure) {
                        CHECK(std::this_thread::get_id() == loop_thread);
                        seen.push_back(failure ? message(failure) : std::to_string(i));
                        if (seen.size() == 3)
                            loop.stop();
                    });
    LoopTimer deadline(loop, [&] { loop.stop(); });
    deadline.arm(std::chrono::seconds(10));
    loop.run();
    CHECK(off_loop);
    CHECK(seen == std::vector<std::string>{"0", "job 1 failed", "2"});
}

TEST_CASE("a failed start fails every job; after stop() jobs fail at once")
{
    EventLoop loop;
    LoopWorker worker(loop, [] { throw Error("no filter"); });
    std::string seen;
    bool ran = false;
    worker.post([&] { ran = true; }, [&](std::exception_ptr failure) {
        seen = message(failure);
        loop.stop();
    });
    LoopTimer deadline(loop, [&] { loop.stop(); });
    deadline.arm(std::chrono::seconds(10));
    loop.run();
    CHECK_FALSE(ran);
    CHECK(seen == "no filter");
    worker.stop();
    worker.post([&] { ran = true; }, [&](std::exception_ptr failure) { seen = message(failure); });
    CHECK_FALSE(ran);
    CHECK(seen == "the VM stopped");
}

TEST_CASE("stop() waits for the running job and reports it; jobs never started fail")
{
    EventLoop loop;
    LoopWorker worker(loop, [] {});
    std::atomic<bool> started{false};
    std::vector<std::string> seen;
    worker.post([&] {
        started = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    },
                [&](std::exception_ptr failure) { seen.push_back(failure ? message(failure) : "first done"); });
    worker.post([] {}, [&](std::exception_ptr failure) { seen.push_back(failure ? message(failure) : "second done"); });
    while (!started)
        std::this_thread::yield();
    worker.stop();
    CHECK(seen.size() == 2);
    CHECK(seen.at(0) == "first done");
    // The second may have started before stop() took the queue; if not, it failed.
    CHECK((seen.at(1) == "second done" || seen.at(1) == "the VM stopped"));
}
