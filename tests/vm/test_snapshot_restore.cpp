// Snapshot bake and restore with the real guest: a restored guest runs commands with the
// host's clock, clones are independent and random, the snapshot itself never changes, 100
// restores in a row leave nothing behind, every bad snapshot is refused with its cause, a
// snapshot file written in place is hashed and refused, and
// run uses set-up's default snapshot unless told otherwise or it is unusable.
// The cases are in snapshot_check.py; this test runs it where a real guest boots and checks
// each verdict.
#include <doctest/doctest.h>

#include "tests/vm/vm_test.hpp"

using namespace agentvm::test;

TEST_CASE("a baked snapshot restores into independent clones; bad snapshots are refused")
{
    const auto r = run_in_testhost({"python3", SNAPSHOT_CHECK, AGENTVM_BIN}, std::chrono::seconds(1500));
    INFO("stdout: " << r.out << "\nstderr: " << r.err);
    for (const char* name : {"bake", "restore_runs", "clones_independent", "snapshot_unchanged", "hundred_restores",
                             "bad_inputs", "stamp_checks", "default_snapshot"})
        CHECK_MESSAGE(r.out.find(std::string("ok ") + name + ":") != std::string::npos, name);
    CHECK(r.exit_code == 0);
}
