// The cgroup under which the agent runs every tool call, each exec call and each shell
// session in a child cgroup of its own (guest/agent/call_cgroup.hpp):
//  - its pids.max bounds how many processes and threads all calls have at once, background
//    ones included, so a fork bomb gets EAGAIN from fork() while init and the agent, outside
//    it, go on;
//  - the cpu controller shares the CPU between the agent and the calls as a whole, and among
//    the calls between their cgroups rather than their processes, so a call that left
//    hundreds of busy processes behind starves neither the agent nor the calls after it.
// The guest runs calls as root: these limits stop runaway code, not code that sets out to
// undo them. What such code can reach is still only its own VM.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace agentvm {

inline constexpr char calls_cgroup_path[] = "/sys/fs/cgroup/tool-calls";

// With cgroup2 mounted at /sys/fs/cgroup: hands the cpu and pids controllers to the root's
// children, creates calls_cgroup_path with pids.max = pids_max and the cpu controller for its
// own children. Returns the path, or nullopt after saying on the console why not.
std::optional<std::string> make_calls_cgroup(uint32_t pids_max);

} // namespace agentvm
