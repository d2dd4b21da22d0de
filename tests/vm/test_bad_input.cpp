// Every bad input gives one clear line naming the problem and a non-zero exit.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>

#include "tests/vm/vm_test.hpp"

using namespace agentvm::test;

namespace {

void check_refused(const agentvm::test::ProcessResult& r, int code, const std::string& needle)
{
    INFO("exit " << r.exit_code << ", stderr: " << r.err);
    CHECK(r.exit_code == code);
    CHECK(r.err.find(needle) != std::string::npos);
    CHECK(r.out.empty());
}

} // namespace

TEST_CASE("missing or unusable kernel and rootfs files")
{
    check_refused(run_agentvm({"boot", "--kernel", "/nonexistent/vmlinux"}), 1, "/nonexistent/vmlinux");
    check_refused(run_agentvm({"boot", "--rootfs", "/nonexistent/rootfs.ext4"}), 1, "/nonexistent/rootfs.ext4");
    check_refused(run_agentvm({"boot", "--kernel", "/etc/hostname"}), 1, "neither an ELF vmlinux nor a bzImage");
}

TEST_CASE("memory and CPU counts out of range")
{
    check_refused(run_agentvm({"boot", "--mem", "8"}), 1, "too small for kernel");
    check_refused(run_agentvm({"boot", "--mem", "100000000"}), 1, "--mem 100000000 MiB is out of range");
    check_refused(run_agentvm({"boot", "--cpus", "0"}), 1, "--cpus 0 is out of range");
    check_refused(run_agentvm({"boot", "--cpus", "100000"}), 1, "--cpus 100000 is out of range");
}

TEST_CASE("an unusable console path is named, and a VM that is never built leaves no console file")
{
    check_refused(run_agentvm({"boot", "--console", "/nonexistent/dir/console.log"}), 1,
                  "/nonexistent/dir/console.log");
    const std::string console = std::string(VM_TEST_DIR) + "/console-never-built.log";
    std::filesystem::remove(console);
    check_refused(run_agentvm({"boot", "--mem", "8", "--console", console}), 1, "too small for kernel");
    CHECK_FALSE(std::filesystem::exists(console));
}

TEST_CASE("bad flags are usage errors")
{
    check_refused(run_agentvm({"boot", "--no-such-flag"}), 2, "no-such-flag");
    check_refused(run_agentvm({"boot", "--cpus", "many"}), 2, "--cpus");
    check_refused(run_agentvm({"--log-level", "loud", "boot"}), 1, "unknown --log-level 'loud'");
}

TEST_CASE("a host that cannot boot Linux guests is named as such, and points at the test host")
{
    // Runs agentvm directly, not through the test host: this is about the host itself.
    const auto r = run_process({AGENTVM_BIN, "boot", "--mem", "8"}, std::chrono::seconds(60));
    const bool hardware_kvm = ::access("/sys/module/kvm_pvm", F_OK) != 0 && ::access("/dev/kvm", F_OK) == 0;
    if (hardware_kvm)
        check_refused(r, 1, "too small for kernel");  // got past the host check to the next one
    else
        check_refused(r, 1, "tests/testhost/run");
}
