// agentvm episode against a real guest, as a harness drives it: every behaviour of the
// tool-call protocol (docs/protocol.md) and every way an episode can end. The scenarios are in
// episode_check.py; this test runs it where a real guest boots and checks each verdict.
#include <doctest/doctest.h>

#include "tests/vm/vm_test.hpp"

using namespace agentvm::test;

TEST_CASE("agentvm episode serves tool calls and reports every way a call or the VM can end")
{
    // Emulated, 64 MiB through the guest and 100 MiB of output take a few minutes.
    const auto r = run_in_testhost({"python3", EPISODE_CHECK, AGENTVM_BIN}, std::chrono::seconds(1500));
    INFO("stdout: " << r.out << "\nstderr: " << r.err);
    for (const char* name : {"basics", "sequential", "concurrent", "big_file", "capped_output", "big_response",
                             "timeout_kills_group", "malformed_lines", "shell_state", "resume_refused", "fresh_episode",
                             "eof_answers_pipelined", "close_op", "announce_ready", "agent_killed", "vm_dies", "episode_timeout",
                             "jailed"})
        CHECK_MESSAGE(r.out.find(std::string("ok ") + name + ":") != std::string::npos, name);
    CHECK(r.exit_code == 0);
}
