// Calls that must run one at a time, in the order they were sent, each on a thread of its
// own: the shell calls take turns on the agent's one bash, the run_code calls of a context on
// its interpreter. Each call takes a ticket when it is read and waits for its turn; a call
// that ends (or never starts) passes the turn on.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <set>

namespace agentvm {

class Turns {
public:
    uint64_t take_ticket()
    {
        std::lock_guard lock(mutex_);
        return tickets_++;
    }

    void wait_for(uint64_t ticket)
    {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return turn_ == ticket; });
    }

    // The ticket's call is over (or will not run): the turn moves past every finished one.
    void finish(uint64_t ticket)
    {
        std::lock_guard lock(mutex_);
        finished_.insert(ticket);
        while (finished_.erase(turn_))
            ++turn_;
        changed_.notify_all();
    }

private:
    std::mutex mutex_;
    std::condition_variable changed_;
    uint64_t tickets_ = 0;
    uint64_t turn_ = 0;
    std::set<uint64_t> finished_;
};

} // namespace agentvm
