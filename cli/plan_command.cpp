#include <CLI/CLI.hpp>

#include "cli/plan_command.hpp"

#include <memory>

#include "cli/seconds_option.hpp"
#include "service/plan/capacity_plan.hpp"

namespace agentvm {

Subcommand add_plan_command(CLI::App& app)
{
    auto options = std::make_shared<PlanSettings>();
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
