// vsock end to end with a real guest: host -> guest through the hybrid Unix socket's CONNECT
// handshake, guest -> host through <uds>_<port>, ~1 MiB each way (credit flow control at
// work), and refusals for ports nobody listens on. The scenario itself is vsock_check.py,
// which needs Python on both sides; this test runs it where a real guest boots.
#include <doctest/doctest.h>

#include "tests/vm/vm_test.hpp"

using namespace agentvm::test;

TEST_CASE("streams cross vsock both ways through the hybrid Unix socket")
{
    const auto r = run_in_testhost({"python3", VSOCK_CHECK, AGENTVM_BIN});
    INFO("stdout: " << r.out << "\nstderr: " << r.err);
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("host-to-guest ok: 1048580 bytes each way, bad handshakes closed") != std::string::npos);
    CHECK(r.out.find("guest-to-host ok: 1048576 bytes each way, unlistened port refused") != std::string::npos);
}
