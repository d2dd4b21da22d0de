// agentvm serve with real sandboxes: the pool's warm and cold paths, calls, files, timeouts,
// a VMM killed, errors, /run_code, metrics, drain, kill -9, a create/delete soak, fork,
// pause and resume across serve restarts, a guest that forges its agent's answers, ports in and
// egress out, and serve started as its systemd unit starts it, as a user of its own. The
// scenarios are in tests/service/serve_check.py; this test runs it where a real guest boots and
// checks each.
#include <doctest/doctest.h>

#include "tests/vm/vm_test.hpp"

using namespace agentvm::test;

TEST_CASE("agentvm serve runs sandboxes from a warm pool and answers every call and failure as documented")
{
    // Up to 9 VMs at once: the test host gets room for them.
    const auto r = run_in_testhost({"python3", SERVE_CHECK, AGENTVM_SERVE_BIN}, std::chrono::seconds(1500), 4096);
    INFO("stdout: " << r.out << "\nstderr: " << r.err);
    for (const char* name : {"pool_warm_and_cold", "state_within_not_across", "big_file_both_ways", "streaming",
                             "timeouts", "vm_killed", "errors", "run_code", "code_cancel_file_info", "run_jupyter", "fusion_limits", "metrics_match", "guest_ports", "guest_egress",
                             "drain_with_call_in_flight",
                             "kill9_leaves_nothing", "soak_no_leaks", "memory_reserve_refuses", "pool_warmup",
                             "plan_calibrates", "fork_pause_resume", "hostile_guest", "serve_unit"})
        CHECK_MESSAGE(r.out.find(std::string("ok ") + name + ":") != std::string::npos, name);
    CHECK(r.exit_code == 0);
}
