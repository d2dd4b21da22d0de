#include "vmm/pause_gate.hpp"

namespace agentvm {

void PauseGate::set_vcpus(size_t count)
{
    std::lock_guard lock(mutex_);
    vcpus_ = count;
}

PauseGate::State PauseGate::state() const
{
    std::lock_guard lock(mutex_);
    if (stopping_)
        return State::stopping;
    if (!requested_)
        return State::running;
    return parked_ == vcpus_ ? State::parked : State::pause_requested;
}

bool PauseGate::request_pause()
{
    std::lock_guard lock(mutex_);
    if (stopping_ || requested_)
        return false;
    requested_.store(true, std::memory_order_release);
    return true;
}

PauseGate::State PauseGate::wait_parked(std::chrono::microseconds patience)
{
    {
        std::unique_lock lock(mutex_);
        cv_.wait_for(lock, patience, [this] { return stopping_ || !requested_ || parked_ == vcpus_; });
    }
    return state();
}

void PauseGate::resume()
{
    {
        std::lock_guard lock(mutex_);
        if (stopping_)
            return;
        requested_.store(false, std::memory_order_release);
    }
    cv_.notify_all();
}

void PauseGate::stop()
{
    {
        std::lock_guard lock(mutex_);
        stopping_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
}

void PauseGate::park()
{
    std::unique_lock lock(mutex_);
    ++parked_;
    // The loop waits in wait_parked() for the last one.
    cv_.notify_all();
    cv_.wait(lock, [this] { return !requested_ || stopping_; });
    --parked_;
}

} // namespace agentvm
