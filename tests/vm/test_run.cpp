// agentvm run against a real guest: streamed output, exit statuses, agentvm's own statuses,
// and nothing left behind. The cases are in run_check.py; this test runs it where a real
// guest boots and checks each case's verdict.
#include <doctest/doctest.h>

#include "tests/vm/vm_test.hpp"

using namespace agentvm::test;

TEST_CASE("agentvm run passes on a command's output and status, and its own failures as 124-127")
{
    const auto r = run_in_testhost({"python3", RUN_CHECK, AGENTVM_BIN}, std::chrono::seconds(900));
    INFO("stdout: " << r.out << "\nstderr: " << r.err);
    for (const char* name : {"streams_and_status", "order_and_binary", "shell_env_workdir_stdin",
                             "own_statuses", "disk_size", "guest_pids", "big_output", "closed_stdout",
                             "nothing_left_behind", "egress"})
        CHECK_MESSAGE(r.out.find(std::string("ok ") + name + ":") != std::string::npos, name);
    CHECK(r.exit_code == 0);
}
