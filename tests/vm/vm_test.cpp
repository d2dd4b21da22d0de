#include "tests/vm/vm_test.hpp"

#include <doctest/doctest.h>

#include <filesystem>

namespace agentvm::test {
namespace {

ProcessResult through_testhost(std::vector<std::string> argv, std::chrono::seconds timeout)
{
    argv.insert(argv.begin(), {TESTHOST_RUN, "--"});
    auto result = run_process(argv, timeout);
    if (result.exit_code == testhost_unavailable)
        FAIL("the test host cannot run here: " << result.err);
    return result;
}

} // namespace

ProcessResult run_agentvm(const std::vector<std::string>& args, std::chrono::seconds timeout)
{
    std::vector<std::string> argv{AGENTVM_BIN};
    argv.insert(argv.end(), args.begin(), args.end());
    return through_testhost(argv, timeout);
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
