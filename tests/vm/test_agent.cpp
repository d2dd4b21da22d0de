// The guest agent in a real guest, over the real virtio-vsock device: tool calls as a harness
// will make them (docs/protocol.md). The scenario is agent_check.py; this test runs it where
// a real guest boots.
#include <doctest/doctest.h>

#include "tests/vm/vm_test.hpp"

using namespace agentvm::test;

TEST_CASE("tool calls reach the guest agent over vsock and come back whole")
{
    const auto r = run_in_testhost({"python3", AGENT_CHECK, AGENTVM_BIN});
    INFO("stdout: " << r.out << "\nstderr: " << r.err);
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("agent ok: exec, shell state, 300000-byte file round trip, malformed line, "
                     "agent restarted after being killed, SIGTERM teardown") != std::string::npos);
}
