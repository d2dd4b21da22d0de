// Runs a child process for tests that drive agentvm as a user would: argv in, exit status,
// stdout and stderr out, killed (with its process group) if it outlives the timeout.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace agentvm::test {

struct ProcessResult {
    int exit_code = -1;      // 0-255, or 128+N when killed by signal N
    bool timed_out = false;
    std::string out;
    std::string err;
};

ProcessResult run_process(const std::vector<std::string>& argv, std::chrono::seconds timeout);

std::string read_file(const std::string& path);
// sha256 of a file, through coreutils' sha256sum.
std::string sha256_of(const std::string& path);

} // namespace agentvm::test
