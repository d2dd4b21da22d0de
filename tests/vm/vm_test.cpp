#include "tests/vm/vm_test.hpp"

#include <doctest/doctest.h>

#include <filesystem>

namespace agentvm::test {
ProcessResult run_in_testhost(std::vector<std::string> argv, std::chrono::seconds timeout, unsigned mem_mib)
{
    // The runner's own limit sits inside ours, so a hung guest ends as a clear timeout (124).
    argv.insert(argv.begin(), "--");
    if (mem_mib != 0)
        argv.insert(argv.begin(), {"--mem", std::to_string(mem_mib)});
    argv.insert(argv.begin(), {TESTHOST_RUN, "--timeout", std::to_string(timeout.count() - 30)});
    auto result = run_process(argv, timeout);
    if (result.exit_code == 124)
        FAIL("timed out in the test host: " << result.err);
    if (result.exit_code == testhost_unavailable)
        FAIL("the test host cannot run here: " << result.err);
    return result;
}

ProcessResult run_agentvm(const std::vector<std::string>& args, std::chrono::seconds timeout)
{
    std::vector<std::string> argv{AGENTVM_BIN};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_in_testhost(argv, timeout);
}

Boot boot_guest(const std::string& name, const std::vector<std::string>& args,
                std::chrono::seconds timeout)
{
    const std::string console = std::string(VM_TEST_DIR) + "/console-" + name + ".log";
    std::filesystem::remove(console);
    std::vector<std::string> argv{"boot", "--console", console};
    argv.insert(argv.end(), args.begin(), args.end());
    Boot boot{run_agentvm(argv, timeout), {}};
    boot.console = read_file(console);
    INFO("agentvm stderr: " << boot.process.err);
    INFO("console: " << boot.console);
    return boot;
}

std::string default_rootfs()
{
    return std::filesystem::canonical(std::string(AGENTVM_GUEST_DIR) + "/rootfs.ext4").string();
}

} // namespace agentvm::test
