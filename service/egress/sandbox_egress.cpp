#include "service/egress/sandbox_egress.hpp"

#include <spdlog/spdlog.h>

namespace agentvm {

namespace {

// The proxy's view of its own refusals: the policy's (403) and the sandbox's limits (429)
// were decided; the rest (400, 502, 504) failed.
const char* result_of(const EgressOutcome& outcome)
{
    if (outcome.allowed)
        return "allowed";
    if (outcome.refusal == ProxyRefusalStatus::forbidden || outcome.refusal == ProxyRefusalStatus::too_many_requests)
        return "refused";
    return "failed";
}

} // namespace

SandboxEgress::SandboxEgress(EventLoop& loop, EgressLimits limits)
    : loop_(loop), limits_(limits), poller_(loop), resolver_(loop)
{
}

SandboxEgress::~SandboxEgress()
{
    proxies_.clear();
}

void SandboxEgress::open(Sandbox& sandbox, EgressPolicy policy)
{
    EgressProxy::Hooks hooks;
    hooks.on_request = [&sandbox](const ProxyRequest& request) {
        return sandbox.record(Json{{"op", "egress"}, {"method", request.method},
                                   {"destination", request.destination.where()}});
    };
    hooks.on_end = [this, &sandbox](std::optional<uint64_t> history, const EgressOutcome& outcome) {
        record_end(sandbox, history, outcome);
    };
    proxies_[&sandbox] = std::make_unique<EgressProxy>(loop_, poller_, resolver_, std::move(policy), limits_,
                                                       EgressProxy::socket_for(sandbox.guest_socket()),
                                                       std::move(hooks));
}

void SandboxEgress::close(Sandbox& sandbox)
{
    // Erased before it is destroyed: its connections' ends reach record_end while it closes.
    const auto it = proxies_.find(&sandbox);
    if (it == proxies_.end())
        return;
    std::unique_ptr<EgressProxy> proxy = std::move(it->second);
    proxies_.erase(it);
    proxy.reset();
}

EgressProxy* SandboxEgress::find(Sandbox& sandbox)
{
    const auto it = proxies_.find(&sandbox);
    return it == proxies_.end() ? nullptr : it->second.get();
}

void SandboxEgress::record_end(Sandbox& sandbox, std::optional<uint64_t> history, const EgressOutcome& outcome)
{
    const char* result = result_of(outcome);
    ++connections_[result];
    bytes_out_ += outcome.bytes_out;
    bytes_in_ += outcome.bytes_in;
    Json answer;
    if (outcome.allowed) {
        answer = Json{{"allowed", true},         {"address", outcome.address}, {"bytes_out", outcome.bytes_out},
                      {"bytes_in", outcome.bytes_in}, {"seconds", outcome.seconds}, {"ended", outcome.reason}};
    } else {
        const int status = outcome.refusal ? static_cast<int>(*outcome.refusal) : 0;
        answer = Json{{"error", {{"code", std::string("egress_") + result},
                                 {"message", outcome.reason},
                                 {"status", status},
                                 {"seconds", outcome.seconds}}}};
    }
    // A connection refused before its request was read has no entry yet.
    const uint64_t seq = history ? *history : sandbox.record(Json{{"op", "egress"}});
    sandbox.record_end(seq, answer);
    spdlog::debug("sandbox {}: egress {} {} {}: {}", sandbox.id(), outcome.method, outcome.destination, result,
                  outcome.reason);
}

void SandboxEgress::write_metrics(MetricsText& out) const
{
    out.family("agentvm_egress_connections_total", "counter",
               "connections out through sandboxes' egress proxies, by result (allowed, refused by policy or "
               "limit, failed)");
    for (const char* result : {"allowed", "refused", "failed"}) {
        const auto it = connections_.find(result);
        out.sample("agentvm_egress_connections_total", label("result", result),
                   it == connections_.end() ? 0.0 : static_cast<double>(it->second));
    }
    out.family("agentvm_egress_bytes_total", "counter", "bytes through sandboxes' egress proxies");
    out.sample("agentvm_egress_bytes_total", label("direction", "out"), static_cast<double>(bytes_out_));
    out.sample("agentvm_egress_bytes_total", label("direction", "in"), static_cast<double>(bytes_in_));
    size_t open = 0;
    for (const auto& [sandbox, proxy] : proxies_)
        open += proxy->open_connections();
    out.family("agentvm_egress_open_connections", "gauge", "connections out open now");
    out.sample("agentvm_egress_open_connections", "", static_cast<double>(open));
}

} // namespace agentvm
