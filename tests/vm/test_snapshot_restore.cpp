// Snapshots with the real guest, in one boot of the test host.
// Baked (snapshot_check.py): a restored guest runs commands with the host's clock, clones are
// independent and random, the snapshot itself never changes, 100 restores in a row leave
// nothing behind, every bad snapshot is refused with its cause, a snapshot file written in
// place is hashed and refused, and run uses set-up's default snapshot unless told otherwise or
// it is unusable.
// Live (fork_check.py, issue 17): a fork into four children that keep their parent's files,
// shell, background job and interpreter and diverge; a fork of a fork; five pause/resume
// cycles; a changed or missing parent refused by name; a name in use, two snapshots at once,
// a full disk and an episode without --snapshot-dir.
#include <doctest/doctest.h>

#include "tests/vm/vm_test.hpp"

using namespace agentvm::test;

TEST_CASE("baked and live snapshots restore, fork and resume with their state; bad ones are refused")
{
    const std::string both = std::string("python3 ") + SNAPSHOT_CHECK + " " + AGENTVM_BIN + "; baked=$?; python3 " +
                             FORK_CHECK + " " + AGENTVM_BIN + " && exit $baked";
    // Up to 5 VMs at once (a parent and four children): the test host gets room for them.
    const auto r = run_in_testhost({"sh", "-c", both}, std::chrono::seconds(1700), 4096);
    INFO("stdout: " << r.out << "\nstderr: " << r.err);
    for (const char* name : {"bake", "restore_runs", "clones_independent", "snapshot_unchanged", "hundred_restores",
                             "bad_inputs", "stamp_checks", "default_snapshot", "fork_children", "fork_of_fork",
                             "pause_resume_cycles", "broken_chains", "snapshot_faults"})
        CHECK_MESSAGE(r.out.find(std::string("ok ") + name + ":") != std::string::npos, name);
    CHECK(r.exit_code == 0);
}
