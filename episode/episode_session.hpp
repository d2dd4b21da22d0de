// `agentvm episode`: one VM for the life of the process, tool calls as JSON lines on stdin and
// stdout through the episode relay (docs/protocol.md), and how the episode ends: the error
// every unanswered call gets, and the exit status.
#pragma once

#include <map>
#include <string>

#include "episode/episode_relay.hpp"
#include "episode/vm_options.hpp"

namespace agentvm {

struct EpisodeSettings {
    VmOptions vm{VmRole::agent};
    double boot_timeout_s = 60;
    double call_timeout_s = EpisodeRelay::default_call_timeout_s;
    bool announce_ready = false;
    std::string snapshot_dir;  // where "snapshot" calls write (--snapshot-dir); empty: refused
    std::map<std::string, std::string> env;  // every call's, under what env ops set (EpisodeRelay::preset_env)
};

// The VMM's work: in the jailed child, or in this process with --no-jail (run_supervised).
// Returns the exit status; throws Error for what fails before the VM runs.
int run_episode(EpisodeSettings& settings);

} // namespace agentvm
