// Host names resolved for the egress proxy off serve's loop: getaddrinfo blocks (for as long
// as resolv.conf's timeouts and attempts allow), so it runs on a few threads beside the loop
// (LoopWorker), and each answer comes back on the loop. The threads start with the first
// lookup, so a serve whose sandboxes never connect out runs none.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/event_loop.hpp"
#include "core/loop_worker.hpp"
#include "service/egress/address_class.hpp"

namespace agentvm {

struct Resolution {
    std::vector<IpAddress> addresses;  // in getaddrinfo's order, each once; empty on failure
    std::string error;                 // why there are none
};

class NameResolver {
public:
    static constexpr size_t threads = 4;
    // A name resolves to at most this many addresses that the proxy will look at.
    static constexpr size_t max_addresses = 16;
    using Done = std::function<void(Resolution)>;

    explicit NameResolver(EventLoop& loop) : loop_(loop) {}

    // `done` runs on the loop, exactly once (also when serve stops first: with an error).
    void resolve(const std::string& host, Done done);

private:
    struct Worker {
        std::unique_ptr<LoopWorker> thread;
        size_t queued = 0;
    };
    EventLoop& loop_;
    std::vector<Worker> workers_;
};

} // namespace agentvm
