// hostile tier, runaway code: CPU, processes, memory and output without bounds. The attacks
// and what is checked after each are in hostile_check.py (group "runaway").
#include <doctest/doctest.h>

#include "tests/hostile/hostile_test.hpp"

using namespace agentvm::test;

namespace {
const ProcessResult& run()
{
    return hostile_group("runaway");
}
} // namespace

TEST_CASE("cpu_spin: while True: pass ends at the call's timeout")
{
    check_attack(run(), "cpu_spin");
}

TEST_CASE("fork_bomb: a fork loop dies with its process group at the call's timeout")
{
    check_attack(run(), "fork_bomb");
}

TEST_CASE("fork_bomb_background: a backgrounded bomb is held at the calls' pids.max, the agent answers on")
{
    check_attack(run(), "fork_bomb_background");
}

TEST_CASE("cpu_spin_without_timeout: calls without a timeout end at the episode's default call timeout")
{
    check_attack(run(), "cpu_spin_without_timeout");
}

TEST_CASE("memory_hog: allocating beyond --mem ends as oom_killed, the agent untouched")
{
    check_attack(run(), "memory_hog");
}

TEST_CASE("stdout_flood: flooded stdout and stderr are capped at max_output")
{
    check_attack(run(), "stdout_flood");
}

TEST_CASE("stdout_flood_default_cap: a 96 MiB response still crossing does not trip the watchdog")
{
    check_attack(run(), "stdout_flood_default_cap");
}

TEST_CASE("runaway group: no failure, the bystander answered to the end")
{
    check_group_end(run());
}
