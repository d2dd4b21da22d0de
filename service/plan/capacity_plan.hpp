// `agentvm plan`: from a training configuration, the sandboxes, warm pool, host memory and
// cores it needs, using what a sandbox costs on this host (service/plan/host_calibration.hpp).
#pragma once

namespace agentvm {

// Each field named after its flag.
struct PlanSettings {
    int gpus = 0;
    int rollouts_per_gpu = 1;
    int tool_steps = 1;
    double step_time_s = 1;
    double episode_length_s = 60;
    int calibration_runs = 3;
    int calls = 20;
    bool json = false;
};

// Calibrates, applies the model (docs/cli.md, "Planning a host") and prints the plan, as text
// or JSON. Returns the exit status; throws Error when the calibration fails.
int run_plan(const PlanSettings& settings);

} // namespace agentvm
