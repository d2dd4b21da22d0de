// vm tier: boots the real kernel and rootfs with the real agentvm binary, through
// tests/testhost/run, which runs it directly on hardware KVM and inside the emulated test
// host elsewhere.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "tests/support/process.hpp"

namespace agentvm::test {

// The test host runner could not start (e.g. QEMU missing): the tier cannot run here.
inline constexpr int testhost_unavailable = 125;

struct Boot {
    ProcessResult process;
    std::string console;
};

// Runs `agentvm boot --console FILE ARGS...` where a real guest can boot, and returns its
// result and the console text. name keeps concurrent tests' console files apart.
Boot boot_guest(const std::string& name, const std::vector<std::string>& args,
                std::chrono::seconds timeout = std::chrono::seconds(300));

// Runs agentvm with ARGS where a real guest can boot (for bad-input cases that need KVM).
ProcessResult run_agentvm(const std::vector<std::string>& args,
                          std::chrono::seconds timeout = std::chrono::seconds(300));

// Runs any command where a real guest can boot; mem_mib sets the test host's memory (0: its
// default), for tests that run many VMs at once.
ProcessResult run_in_testhost(std::vector<std::string> argv,
                              std::chrono::seconds timeout = std::chrono::seconds(300), unsigned mem_mib = 0);

std::string default_rootfs();

} // namespace agentvm::test
