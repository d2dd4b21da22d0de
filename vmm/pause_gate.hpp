// The gate every vCPU thread passes on each turn of its loop: the VM's pause (a live
// snapshot parks every vCPU outside KVM_RUN) and its end, as one small state machine:
//
//   running --request_pause()--> pause_requested --(every vCPU in park())--> parked
//      ^                               |                                        |
//      +----------- resume() ----------+----------------------------------------+
//   any state --stop()--> stopping (for good: parked vCPUs go on, to stop)
//
// The vCPU threads read the request and the stop without the lock on every exit (atomics), and
// take it only to park. Pure threading, no KVM: tests drive it with plain threads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>

namespace agentvm {

class PauseGate {
public:
    enum class State { running, pause_requested, parked, stopping };

    // Before the vCPU threads start: how many must park for the VM to be parked.
    void set_vcpus(size_t count);
    State state() const;

    // --- the I/O loop's thread -----------------------------------------------------------

    // running -> pause_requested. False, changing nothing, in any other state (a pause under
    // way, or stopping).
    bool request_pause();
    // Waits up to `patience` for every vCPU to park; returns the state then.
    State wait_parked(std::chrono::microseconds patience);
    // pause_requested or parked -> running: parked vCPUs go on. Nothing once stopping.
    void resume();

    // --- any thread ----------------------------------------------------------------------

    void stop();
    bool stopping() const { return stopping_.load(std::memory_order_acquire); }

    // --- vCPU threads --------------------------------------------------------------------

    // Whether the calling vCPU should park(): checked on every exit.
    bool pause_requested() const { return requested_.load(std::memory_order_acquire); }
    // Counts the caller as parked until resume() or stop().
    void park();

private:
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    std::atomic<bool> requested_{false};  // written under mutex_
    std::atomic<bool> stopping_{false};   // likewise
    size_t vcpus_ = 0;
    size_t parked_ = 0;  // guarded by mutex_
};

} // namespace agentvm
