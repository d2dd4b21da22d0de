#include <CLI/CLI.hpp>

#include "cli/plan_command.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/host_calibration.hpp"
#include "cli/seconds_option.hpp"

namespace agentvm {
namespace {

struct PlanOptions {
    int gpus = 0;
    int rollouts_per_gpu = 1;
    int tool_steps = 1;
    double step_time_s = 1;
    double episode_length_s = 60;
    int calibration_runs = 3;
    int calls = 20;
    bool json = false;
};

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
Plan make_plan(const PlanOptions& o, const SandboxCosts& costs)
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

int run_plan(const PlanOptions& o)
{
    const auto program = std::filesystem::read_symlink("/proc/self/exe").string();
    const SandboxCosts costs = calibrate(program, o.calibration_runs, o.calls);
    const Plan plan = make_plan(o, costs);
    if (o.json) {
        const nlohmann::ordered_json out{
            {"input", {{"gpus", o.gpus}, {"rollouts_per_gpu", o.rollouts_per_gpu}, {"tool_steps", o.tool_steps},
                       {"step_time_s", o.step_time_s}, {"episode_length_s", o.episode_length_s}}},
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
                          o.gpus, o.rollouts_per_gpu, o.tool_steps, o.step_time_s, o.episode_length_s)
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
                          plan.cores, plan.calls_per_s, o.step_time_s, costs.call_cpu_s * 1000, plan.creates_per_s,
                          costs.restore_cpu_s * 1000)
                  .c_str());
    return 0;
}

} // namespace

Subcommand add_plan_command(CLI::App& app)
{
    auto options = std::make_shared<PlanOptions>();
    auto* plan = app.add_subcommand("plan", "Size a host for a training configuration, from what a sandbox costs "
                                            "here (a short calibration runs a few restored VMs)");
    plan->add_option("--gpus", options->gpus, "GPUs generating rollouts")->required()->check(CLI::Range(1, 10000000));
    plan->add_option("--rollouts-per-gpu", options->rollouts_per_gpu, "rollouts in flight per GPU")
        ->capture_default_str()
        ->check(CLI::Range(1, 100000));
    plan->add_option("--tool-steps", options->tool_steps, "tool calls per rollout")
        ->capture_default_str()
        ->check(CLI::Range(1, 100000));
    plan->add_option("--step-time", options->step_time_s, "mean seconds a tool call runs")
        ->capture_default_str()
        ->check(seconds_option(true));
    plan->add_option("--episode-length", options->episode_length_s, "seconds a rollout holds its sandbox")
        ->capture_default_str()
        ->check(seconds_option());
    plan->add_option("--calibration-runs", options->calibration_runs, "VMs the calibration runs, one after another")
        ->capture_default_str()
        ->check(CLI::Range(1, 100));
    plan->add_option("--calls", options->calls, "calls per calibration VM")
        ->capture_default_str()
        ->check(CLI::Range(1, 10000));
    plan->add_flag("--json", options->json, "print the plan as JSON");
    return {plan, [options] { return run_plan(*options); }};
}

} // namespace agentvm
