// Live snapshots of running episodes with the real guest (issue 17): a fork into four
// children that keep their parent's files, shell, background job and interpreter and diverge;
// a fork of a fork; five pause/resume cycles; a changed or missing parent refused by name; a
// name in use, a full disk and an episode without --snapshot-dir failing cleanly. The cases
// are in fork_check.py; this test runs it where a real guest boots and checks each verdict.
#include <doctest/doctest.h>

#include "tests/vm/vm_test.hpp"

using namespace agentvm::test;

TEST_CASE("running episodes fork, pause and resume with their state; broken chains are refused")
{
    const auto r = run_in_testhost({"python3", FORK_CHECK, AGENTVM_BIN}, std::chrono::seconds(1500), 4096);
    INFO("stdout: " << r.out << "\nstderr: " << r.err);
    for (const char* name :
         {"fork_children", "fork_of_fork", "pause_resume_cycles", "broken_chains", "snapshot_faults"})
        CHECK_MESSAGE(r.out.find(std::string("ok ") + name + ":") != std::string::npos, name);
    CHECK(r.exit_code == 0);
}
