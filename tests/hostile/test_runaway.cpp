// hostile tier, runaway code: CPU, processes, memory and output without bounds. The attacks
// and what is checked after each are in hostile_check.py (group "runaway"). Not listed here,
// because today's agentvm does not contain them (hostile_check.py's NOT_YET_CONTAINED):
// fork_bomb_background, stdout_flood_default_cap, cpu_spin_without_timeout.
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

TEST_CASE("memory_hog: allocating beyond --mem ends as oom_killed, the agent untouched")
{
    check_attack(run(), "memory_hog");
}

TEST_CASE("stdout_flood: flooded stdout and stderr are capped at max_output")
{
    check_attack(run(), "stdout_flood");
}

TEST_CASE("runaway group: no failure, the bystander answered to the end")
{
    check_group_end(run());
}
