#include "service/fleet/capacity_report.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace agentvm {
namespace {

// HAProxy reads the agent's reply up to the first '\r' or '\n' into a small buffer: the
// description stays one short line whatever a pool is named.
constexpr size_t max_reason = 160;

std::string one_line(std::string text)
{
    for (char& c : text)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
            c = ' ';
    if (text.size() > max_reason)
        text = text.substr(0, max_reason - 3) + "...";
    return text;
}

} // namespace

const char* status_name(NodeStatus status)
{
    switch (status) {
    case NodeStatus::ok:
        return "ok";
    case NodeStatus::draining:
        return "draining";
    case NodeStatus::maint:
        return "maint";
    }
    return "ok";
}

std::optional<std::string> start_trouble(const std::vector<PoolStarts>& pools,
                                         std::chrono::steady_clock::time_point now)
{
    if (pools.empty())
        return std::nullopt;
    auto latest = std::chrono::steady_clock::time_point::min();
    std::string counts;
    for (const PoolStarts& pool : pools) {
        if (pool.failed_in_row < maint_after_failures)
            return std::nullopt;
        latest = std::max(latest, pool.last_failure);
        counts += fmt::format("{}{} {}", counts.empty() ? "" : ", ", pool.name, pool.failed_in_row);
    }
    if (now - latest >= maint_probe_after)
        return std::nullopt;
    return one_line(fmt::format("no VM starts: the last starts of every pool failed (in a row: {})", counts));
}

unsigned capacity_weight(const CapacityInputs& in)
{
    const uint64_t max = in.max_sandboxes;
    const uint64_t cold = in.available_mib < in.reserve_mib || in.running >= max ? 0 : max - in.running;
    const uint64_t score = cold + uint64_t{warm_bonus} * in.warm;
    const uint64_t full = max + uint64_t{warm_bonus - 1} * std::min<uint64_t>(in.warm_target, max);
    if (score == 0 || full == 0)
        return 0;
    const uint64_t percent = (200 * score + full) / (2 * full);  // rounded to nearest
    return static_cast<unsigned>(std::clamp<uint64_t>(percent, 1, 100));
}

CapacityReport capacity_report(const CapacityInputs& in)
{
    CapacityReport report;
    report.node_id = in.node_id;
    report.warm = in.warm;
    report.running = in.running;
    report.max_sandboxes = in.max_sandboxes;
    report.available_mib = in.available_mib;
    report.reserve_mib = in.reserve_mib;
    if (in.draining) {
        report.status = NodeStatus::draining;
        return report;
    }
    if (auto trouble = start_trouble(in.pools, in.now)) {
        report.status = NodeStatus::maint;
        report.reason = std::move(*trouble);
        return report;
    }
    report.weight = capacity_weight(in);
    return report;
}

std::string CapacityReport::agent_line() const
{
    switch (status) {
    case NodeStatus::ok:
        // "ready" undoes a drain or maint this agent set; "up" a fail it reported.
        return fmt::format("ready up {}%\n", weight);
    case NodeStatus::draining:
        return "drain\n";
    case NodeStatus::maint:
        // HAProxy shows a description only after a health word ("down", "fail", "stopped"):
        // "fail" also marks the server DOWN, which the next "ready up" undoes.
        return fmt::format("maint fail #{}\n", reason);
    }
    return "drain\n";
}

Json CapacityReport::json() const
{
    Json doc{{"status", status_name(status)},
             {"node", node_id},
             {"weight", weight},
             {"warm", warm},
             {"running", running},
             {"max_sandboxes", max_sandboxes},
             {"available_mib", available_mib},
             {"reserve_mib", reserve_mib}};
    if (!reason.empty())
        doc["reason"] = reason;
    return doc;
}

} // namespace agentvm
