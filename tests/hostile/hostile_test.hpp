// hostile tier: each test file runs one group of hostile_check.py's attacks once, where a real
// guest boots, and checks every attack's verdict in its own test case.
#pragma once

#include <string>

#include "tests/support/process.hpp"

namespace agentvm::test {

// Runs `hostile_check.py AGENTVM --group GROUP` through the test host (at most once per
// process: the test cases of a file share the run).
const ProcessResult& hostile_group(const std::string& group);

// The attack's verdict in that run must be "ok".
void check_attack(const ProcessResult& run, const std::string& attack);

// The whole run ended well: no failed case, the bystander episode answered to the end and
// exited 0, nothing failed in set-up.
void check_group_end(const ProcessResult& run);

} // namespace agentvm::test
