// The egress proxies of serve's sandboxes (docs/api.md, "Egress"): one EgressProxy per sandbox
// whose policy allows anything, opened when the sandbox is handed out and closed when it ends;
// every connection goes into the sandbox's call history, and into /metrics. The sandboxes'
// proxies share one poller and one resolver.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "core/event_loop.hpp"
#include "service/egress/egress_proxy.hpp"
#include "service/metrics.hpp"
#include "service/sandbox.hpp"

namespace agentvm {

class SandboxEgress {
public:
    SandboxEgress(EventLoop& loop, EgressLimits limits);
    ~SandboxEgress();
    SandboxEgress(const SandboxEgress&) = delete;
    SandboxEgress& operator=(const SandboxEgress&) = delete;

    // Starts `sandbox`'s proxy at its guest socket for `policy` (which allows_any()). Throws
    // Error when the socket cannot be had.
    void open(Sandbox& sandbox, EgressPolicy policy);
    // The sandbox ended: its proxy's connections are closed and its socket removed.
    void close(Sandbox& sandbox);
    // Its proxy, if it has one.
    EgressProxy* find(Sandbox& sandbox);

    void write_metrics(MetricsText& out) const;

private:
    void record_end(Sandbox& sandbox, std::optional<uint64_t> history, const EgressOutcome& outcome);

    EventLoop& loop_;
    EgressLimits limits_;
    SocketPoller poller_;
    NameResolver resolver_;
    std::map<Sandbox*, std::unique_ptr<EgressProxy>> proxies_;
    std::map<std::string, uint64_t> connections_;  // by result: allowed, refused, failed
    uint64_t bytes_out_ = 0;
    uint64_t bytes_in_ = 0;
};

} // namespace agentvm
