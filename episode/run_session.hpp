// `agentvm run -- CMD`: a fresh VM for one command, which the agent runs as one exec call; its
// output streamed to ours as it comes, its exit status ours (exit_code::run_*).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "episode/episode_relay.hpp"
#include "episode/vm_options.hpp"
#include "protocol/agent_protocol.hpp"

namespace agentvm {

struct RunSettings {
    VmOptions vm{VmRole::agent};
    double boot_timeout_s = 60;
    double timeout_s = EpisodeRelay::default_call_timeout_s;
    std::vector<std::string> env;
    std::string workdir;
    uint64_t max_output = default_max_output;
    bool forward_stdin = false;
    std::string shell;
    std::vector<std::string> argv;
};

// The VMM's work: in the jailed child, or in this process with --no-jail (run_supervised).
// Returns the exit status; throws Error for what fails before the VM runs, the request's own
// mistakes first.
int run_one_command(RunSettings& settings);

} // namespace agentvm
