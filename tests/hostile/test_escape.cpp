// hostile tier, reaching out of the guest: host files, the network, vsock, PID 1, the agent,
// sysrq. The attacks and what is checked after each are in hostile_check.py (group "escape").
#include <doctest/doctest.h>

#include "tests/hostile/hostile_test.hpp"

using namespace agentvm::test;

namespace {
const ProcessResult& run()
{
    return hostile_group("escape");
}
} // namespace

TEST_CASE("host_paths: the guest cannot read the host's files")
{
    check_attack(run(), "host_paths");
}

TEST_CASE("network: no connection leaves the guest, by IP, DNS or vsock")
{
    check_attack(run(), "network");
}

TEST_CASE("vsock_flood: thousands of guest vsock connections are refused, the VMM unharmed")
{
    check_attack(run(), "vsock_flood");
}

TEST_CASE("vsock_flood_host_listener: with --vsock-uds and a host listener, what the VMM cannot serve is refused, the VM goes on")
{
    check_attack(run(), "vsock_flood_host_listener");
}

TEST_CASE("kill_pid1: signals to PID 1 from inside change nothing")
{
    check_attack(run(), "kill_pid1");
}

TEST_CASE("kill_agent: killing the agent from inside ends the episode with agent_died")
{
    check_attack(run(), "kill_agent");
}

TEST_CASE("sysrq: echo c > /proc/sysrq-trigger fails, the guest goes on")
{
    check_attack(run(), "sysrq");
}

TEST_CASE("escape group: no failure, the bystander answered to the end")
{
    check_group_end(run());
}
