#include "service/sandbox_metrics.hpp"

namespace agentvm {
namespace {

double count_of(const std::map<std::string, uint64_t, std::less<>>& counts, std::string_view key)
{
    const auto it = counts.find(key);
    return it == counts.end() ? 0.0 : static_cast<double>(it->second);
}

} // namespace

void SandboxMetrics::count_refusal(ServiceError code)
{
    ++refusals_[std::string(error_name(code))];
}

void SandboxMetrics::count_failure(std::string_view kind)
{
    ++failures_[std::string(kind)];
}

void SandboxMetrics::count_call(const Json& answer, double seconds)
{
    call_latency_.observe(seconds);
    if (answer.value("timed_out", false))
        count_failure("timeout");
    if (answer.value("oom_killed", false))
        count_failure("oom");
    if (answer.contains("error") && answer["error"].is_object() && answer["error"].value("code", "") == "vm_died")
        count_failure("vm_died_call");
}

void SandboxMetrics::observe_create(double seconds)
{
    create_latency_.observe(seconds);
}

std::string SandboxMetrics::text(const std::vector<const Sandbox*>& vms, const std::map<std::string, Pool>& pools,
                                 uint64_t available_mib, uint64_t reserve_mib) const
{
    MetricsText out;
    std::map<std::string, int> by_state{{"warm", 0}, {"starting", 0}, {"running", 0}, {"stopping", 0}};
    for (const Sandbox* s : vms) {
        if (s->stopping())
            ++by_state["stopping"];
        else if (!s->ready())
            ++by_state["starting"];
        else if (s->assigned())
            ++by_state["running"];
        else
            ++by_state["warm"];
    }
    out.family("agentvm_sandboxes", "gauge", "VMs by state (warm: ready in a pool; running: handed out)");
    for (const auto& [state, count] : by_state)
        out.sample("agentvm_sandboxes", label("state", state), count);
    out.family("agentvm_pool_ready", "gauge", "warm VMs ready per pool");
    for (const auto& [name, pool] : pools)
        out.sample("agentvm_pool_ready", label("pool", name), static_cast<double>(pool.warm.size()));
    out.family("agentvm_pool_target", "gauge", "warm VMs each pool keeps (--pool NAME=N)");
    for (const auto& [name, pool] : pools)
        out.sample("agentvm_pool_target", label("pool", name), pool.config.target);
    out.family("agentvm_creates_total", "counter", "sandboxes created, by pool and path (warm: from the pool)");
    for (const auto& [name, pool] : pools) {
        out.sample("agentvm_creates_total", label("pool", name) + "," + label("path", "warm"),
                   static_cast<double>(pool.created_warm));
        out.sample("agentvm_creates_total", label("pool", name) + "," + label("path", "cold"),
                   static_cast<double>(pool.created_cold));
    }
    out.family("agentvm_create_refusals_total", "counter", "creates refused, by error code");
    for (const char* code : {"at_capacity", "memory_reserve", "draining"})
        out.sample("agentvm_create_refusals_total", label("code", code), count_of(refusals_, code));
    out.family("agentvm_failures_total", "counter",
               "failures by kind: vm_died (a sandbox's VM ended by itself), vm_died_call (calls it failed), "
               "start_failed, timeout and oom (calls), lifetime and idle (sandboxes expired)");
    for (const char* kind : {"vm_died", "vm_died_call", "start_failed", "timeout", "oom", "lifetime", "idle"})
        out.sample("agentvm_failures_total", label("kind", kind), count_of(failures_, kind));
    out.family("agentvm_create_seconds", "histogram", "time from a create request to its sandbox being ready");
    out.histogram("agentvm_create_seconds", "", create_latency_);
    out.family("agentvm_call_seconds", "histogram", "time from a call request to its answer");
    out.histogram("agentvm_call_seconds", "", call_latency_);
    out.family("agentvm_host_memory_available_bytes", "gauge", "MemAvailable of the host");
    out.sample("agentvm_host_memory_available_bytes", "", static_cast<double>(available_mib) * 1048576);
    out.family("agentvm_host_memory_reserve_bytes", "gauge", "memory serve leaves to the host (--mem-reserve)");
    out.sample("agentvm_host_memory_reserve_bytes", "", static_cast<double>(reserve_mib) * 1048576);
    return out.text();
}

} // namespace agentvm
