// What serve counts of its sandboxes for GET /metrics (docs/api.md lists every series): creates
// refused, failures by kind, the latencies of creates and calls, and, read from the manager's
// parts when asked, VMs by state, pools and host memory.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "service/metrics.hpp"
#include "service/pools.hpp"
#include "service/problem.hpp"
#include "service/sandbox.hpp"

namespace agentvm {

class SandboxMetrics {
public:
    void count_refusal(ServiceError code);
    // kind: vm_died, start_failed, lifetime or idle (the calls' own kinds come with count_call).
    void count_failure(std::string_view kind);
    // A call's answer and how long it took (Sandbox::Hooks::on_call_answered).
    void count_call(const Json& answer, double seconds);
    void observe_create(double seconds);

    // The Prometheus text of it all, with `vms` every VM serve runs (by state) and the
    // configured pools.
    std::string text(const std::vector<const Sandbox*>& vms, const std::map<std::string, Pool>& pools,
                     uint64_t available_mib, uint64_t reserve_mib) const;

private:
    std::map<std::string, uint64_t, std::less<>> refusals_;  // by code
    std::map<std::string, uint64_t, std::less<>> failures_;  // by kind
    Histogram create_latency_{latency_buckets()};
    Histogram call_latency_{latency_buckets()};
};

} // namespace agentvm
