#include "service/plan/capacity_plan.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "service/plan/host_calibration.hpp"

namespace agentvm {
namespace {

struct Plan {
    long concurrent = 0;
    double creates_per_s = 0;
    double calls_per_s = 0;
    long pool_burst = 0;
    long pool_steady = 0;
    double memory_gib = 0;
    double cores = 0;
};

// The model (docs/cli.md, "Planning a host"): each rollout holds one sandbox for the episode's
// length and makes its tool calls in it. A synchronous RL step starts every rollout at once,
// so a warm create for each needs a pool as large as the step; a steady stream of rollouts
// needs only what arrives while one VM restores, twice over.
Plan make_plan(const PlanSettings& o, const SandboxCosts& costs)
{
    Plan plan;
    plan.concurrent = static_cast<long>(o.gpus) * o.rollouts_per_gpu;
    plan.creates_per_s = static_cast<double>(plan.concurrent) / o.episode_length_s;
    plan.calls_per_s = plan.creates_per_s * o.tool_steps;
    plan.pool_burst = plan.concurrent;
    plan.pool_steady = std::max(1L, static_cast<long>(std::ceil(2 * plan.creates_per_s * costs.restore_s)));
    plan.memory_gib = static_cast<double>(plan.concurrent + plan.pool_burst) * costs.idle_private_mib / 1024;
    plan.cores = plan.calls_per_s * (o.step_time_s + costs.call_cpu_s) + plan.creates_per_s * costs.restore_cpu_s;
    return plan;
}

} // namespace

int run_plan(const PlanSettings& settings)
{
    const auto program = std::filesystem::read_symlink("/proc/self/exe").string();
    const SandboxCosts costs = calibrate(program, settings.calibration_runs, settings.calls);
    const Plan plan = make_plan(settings, costs);
    if (settings.json) {
        const nlohmann::ordered_json out{
            {"input", {{"gpus", settings.gpus}, {"rollouts_per_gpu", settings.rollouts_per_gpu},
                       {"tool_steps", settings.tool_steps}, {"step_time_s", settings.step_time_s},
                       {"episode_length_s", settings.episode_length_s}}},
            {"measured", {{"runs", costs.runs}, {"restored", costs.restored}, {"restore_s", costs.restore_s},
                          {"restore_cpu_s", costs.restore_cpu_s}, {"idle_private_mib", costs.idle_private_mib},
                          {"call_cpu_s", costs.call_cpu_s}}},
            {"plan", {{"concurrent_sandboxes", plan.concurrent}, {"creates_per_s", plan.creates_per_s},
                      {"calls_per_s", plan.calls_per_s}, {"warm_pool_burst", plan.pool_burst},
                      {"warm_pool_steady", plan.pool_steady}, {"idle_memory_gib", plan.memory_gib},
                      {"cores", plan.cores}}}};
        std::puts(out.dump(2).c_str());
        return 0;
    }
    std::puts(fmt::format("agentvm plan: {} GPUs x {} rollouts x {} tool steps, {} s per step, {} s per episode",
                          settings.gpus, settings.rollouts_per_gpu, settings.tool_steps, settings.step_time_s,
                          settings.episode_length_s)
                  .c_str());
    std::puts(fmt::format("measured here ({} runs, {}): start {:.0f} ms ({:.0f} ms of CPU), idle {:.2f} MiB private, "
                          "{:.2f} ms of CPU per call",
                          costs.runs, costs.restored ? "restored from the default snapshot" : "cold boots",
                          costs.restore_s * 1000, costs.restore_cpu_s * 1000, costs.idle_private_mib,
                          costs.call_cpu_s * 1000)
                  .c_str());
    std::puts(fmt::format("  concurrent sandboxes   {}", plan.concurrent).c_str());
    std::puts(fmt::format("  creates per second     {:.2f}", plan.creates_per_s).c_str());
    std::puts(fmt::format("  tool calls per second  {:.2f}", plan.calls_per_s).c_str());
    std::puts(fmt::format("  warm pool              {} (a step starts every rollout at once); {} for a steady stream",
                          plan.pool_burst, plan.pool_steady)
                  .c_str());
    std::puts(fmt::format("  host memory            {:.1f} GiB for {} idle VMs (sandboxes and pool), plus what the "
                          "tool calls make each guest use (at most its --mem)",
                          plan.memory_gib, plan.concurrent + plan.pool_burst)
                  .c_str());
    std::puts(fmt::format("  host cores             {:.1f} ({:.2f} calls/s x ({} s + {:.2f} ms), {:.2f} creates/s x "
                          "{:.0f} ms; a step's time is counted as CPU)",
                          plan.cores, plan.calls_per_s, settings.step_time_s, costs.call_cpu_s * 1000,
                          plan.creates_per_s, costs.restore_cpu_s * 1000)
                  .c_str());
    return 0;
}

} // namespace agentvm
