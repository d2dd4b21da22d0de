// The guest kernel's OOM killer against an exec call in a real guest: the response says the
// command was OOM-killed, and the agent goes on serving. The scenario is oom_check.py; this
// test runs it where a real guest boots.
#include <doctest/doctest.h>

#include "tests/vm/vm_test.hpp"

using namespace agentvm::test;

TEST_CASE("a command the OOM killer ends is reported as oom_killed; the agent goes on")
{
    // Emulated, filling a guest's memory page by page is slow: more time than a boot needs.
    const auto r = run_in_testhost({"python3", OOM_CHECK, AGENTVM_BIN}, std::chrono::seconds(900));
    INFO("stdout: " << r.out << "\nstderr: " << r.err);
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("oom ok: python3 OOM-killed") != std::string::npos);
}
