// `agentvm doctor`: what this host offers agentvm and what is missing, each problem with what
// to do about it. Each check tries the real thing where it can (opens /dev/kvm, sets up an
// io_uring, creates and removes a VM's cgroup) rather than guessing from file names.
#pragma once

#include <string>
#include <vector>

namespace agentvm {

enum class Verdict {
    ok,
    warning,  // works, with less (no templates, a cold boot each time until the snapshot is baked)
    missing,  // `run` and `episode` cannot work until it is fixed
};

struct Finding {
    std::string what;    // "KVM", "cgroups", "kernel" ...
    Verdict verdict;
    std::string detail;  // what was found
    std::string fix;     // what to do; empty when ok
};

// Every check, in the order printed.
std::vector<Finding> examine_host();

} // namespace agentvm
