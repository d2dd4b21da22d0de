// hostile tier, oversized input: a 100 MiB argv or environment, a 100 MiB JSON line from the
// harness. The attacks and what is checked after each are in hostile_check.py (group "input").
#include <doctest/doctest.h>

#include "tests/hostile/hostile_test.hpp"

using namespace agentvm::test;

namespace {
const ProcessResult& run()
{
    return hostile_group("input");
}
} // namespace

TEST_CASE("argv_env_100mib: a 100 MiB argv or environment is refused with a clear error")
{
    check_attack(run(), "argv_env_100mib");
}

TEST_CASE("json_line_100mib: a 100 MiB request line is answered line_too_long without being buffered")
{
    check_attack(run(), "json_line_100mib");
}

TEST_CASE("input group: no failure, the bystander answered to the end")
{
    check_group_end(run());
}
