// Boots of the real guest: readiness, CPU and memory sizing, the root disk's copy-on-write,
// and a kernel panic reported as such.
#include <doctest/doctest.h>

#include <regex>

#include "tests/vm/vm_test.hpp"

using namespace agentvm::test;

TEST_CASE("the guest reaches readiness, runs the init command and powers off cleanly")
{
    const auto boot = boot_guest("ready", {"--init-cmd", "echo init-cmd-ran"});
    INFO("stderr: " << boot.process.err << "\nconsole: " << boot.console);
    CHECK(boot.process.exit_code == 0);
    CHECK(boot.console.find("agentvm-init: ready") != std::string::npos);
    CHECK(boot.console.find("init-cmd-ran") != std::string::npos);
    CHECK(boot.console.find("agentvm-init: init-cmd exited 0") != std::string::npos);
    // The console went to the file, not to agentvm's stdout.
    CHECK(boot.process.out.find("init-cmd-ran") == std::string::npos);
}

TEST_CASE("the guest sees the vCPUs and memory asked for, and KVM without asynchronous page faults")
{
    // The guest kernel installs its "HYP" interrupt (async page faults' "page ready") only when
    // CPUID offers KVM_FEATURE_ASYNC_PF_INT; kvmclock shows that the KVM leaf itself is there.
    const auto boot = boot_guest(
        "sizing", {"--cpus", "2", "--mem", "384", "--init-cmd",
                   "echo cpus=$(nproc); awk '/MemTotal/ {print \"memkb=\" $2}' /proc/meminfo; "
                   "echo hyp=$(grep -c HYP: /proc/interrupts); cat /sys/devices/system/clocksource/*/available_clocksource"});
    INFO("stderr: " << boot.process.err << "\nconsole: " << boot.console);
    CHECK(boot.process.exit_code == 0);
    CHECK(boot.console.find("cpus=2") != std::string::npos);
    std::smatch m;
    REQUIRE(std::regex_search(boot.console, m, std::regex("memkb=([0-9]+)")));
    const long kb = std::stol(m[1]);
    // MemTotal is RAM less what the kernel keeps for itself: a little under 384 MiB.
    CHECK(kb > 300 * 1024);
    CHECK(kb <= 384 * 1024);
    CHECK(boot.console.find("hyp=0") != std::string::npos);
    CHECK(boot.console.find("kvm-clock") != std::string::npos);
}

TEST_CASE("writes to the root disk read back in the same boot and never reach the base image")
{
    const std::string rootfs = default_rootfs();
    const std::string before = sha256_of(rootfs);
    const auto boot = boot_guest(
        "disk", {"--init-cmd",
                 "head -c 3000000 /dev/urandom > /root/blob && sha256sum /root/blob > /root/blob.sum && "
                 "sync && echo 3 > /proc/sys/vm/drop_caches && sha256sum -c /root/blob.sum && "
                 "echo written-and-read-back"});
    INFO("stderr: " << boot.process.err << "\nconsole: " << boot.console);
    CHECK(boot.process.exit_code == 0);
    CHECK(boot.console.find("/root/blob: OK") != std::string::npos);
    CHECK(boot.console.find("written-and-read-back") != std::string::npos);
    CHECK(sha256_of(rootfs) == before);

    // A second boot starts from the untouched base: the file is gone.
    const auto again = boot_guest("disk-again", {"--init-cmd", "test -e /root/blob && echo blob-present || echo blob-absent"});
    CHECK(again.process.exit_code == 0);
    CHECK(again.console.find("blob-absent") != std::string::npos);
}

TEST_CASE("a guest kernel panic is reported with the panic line and a non-zero exit")
{
    // The last init= wins: the kernel cannot start it and panics.
    const auto boot = boot_guest("panic", {"--cmdline", "init=/does/not/exist"});
    INFO("stderr: " << boot.process.err << "\nconsole: " << boot.console);
    CHECK(boot.process.exit_code == 3);
    CHECK(boot.process.err.find("Kernel panic - not syncing") != std::string::npos);
}

TEST_CASE("a guest kernel that panics and does not reboot is ended at once, not waited on")
{
    // panic=0 (the last panic= wins): the kernel stays in its panic loop instead of rebooting,
    // as it does when its own panic path faults. 120 s is far longer than the boot takes.
    const auto boot = boot_guest("panic-stays", {"--cmdline", "init=/does/not/exist panic=0"}, std::chrono::seconds(120));
    INFO("stderr: " << boot.process.err << "\nconsole: " << boot.console);
    CHECK(boot.process.exit_code == 3);
    CHECK(boot.process.err.find("Kernel panic - not syncing") != std::string::npos);
}
