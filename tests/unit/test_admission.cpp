// Admission control: max_sandboxes and the host memory reserve, the latter read through an
// injected probe so that the host can look short of memory without being so; what refill may
// start; and, through the manager, a create refused on either limit and counted in /metrics.
#include <doctest/doctest.h>

#include <optional>
#include <string>

#include "common/error.hpp"
#include "core/event_loop.hpp"
#include "service/admission.hpp"
#include "service/sandbox_manager.hpp"
#include "tests/support/fake_agentvm.hpp"

using namespace agentvm;
using agentvm::test::FakeAgentvm;

namespace {

struct Host {
    size_t live = 0;
    uint64_t available_mib = 4096;
    Admission admission{2, 1024, [this] { return available_mib; }, [this] { return live; }};
};

std::optional<Refusal> create_refusal(SandboxManager& manager)
{
    std::optional<Refusal> refused;
    bool answered = false;
    manager.create("default", Sandbox::Settings{}, [&](Sandbox*, const Refusal* refusal) {
        answered = true;
        if (refusal)
            refused = *refusal;
    });
    REQUIRE(answered);
    return refused;
}

} // namespace

TEST_CASE("a create is refused at max_sandboxes unless a spare VM makes room")
{
    Host host;
    host.live = 1;
    CHECK_FALSE(host.admission.admit_create([] { return false; }));
    host.live = 2;
    const auto refused = host.admission.admit_create([] { return false; });
    REQUIRE(refused);
    CHECK(refused->code == ServiceError::at_capacity);
    CHECK(refused->message == "2 VMs are running, the most --max-sandboxes allows");
    CHECK(refused->retry_after_s == 1);
    bool asked = false;
    CHECK_FALSE(host.admission.admit_create([&] { return asked = true; }));
    CHECK(asked);
}

TEST_CASE("a create is refused while the memory probe says the host is under its reserve")
{
    Host host;
    host.available_mib = 1023;
    const auto refused = host.admission.admit_create([] { return false; });
    REQUIRE(refused);
    CHECK(refused->code == ServiceError::memory_reserve);
    CHECK(refused->message == "the host has 1023 MiB available, under the 1024 MiB reserve (--mem-reserve)");
    CHECK(refused->retry_after_s == 5);
    host.available_mib = 1024;
    CHECK_FALSE(host.admission.admit_create([] { return false; }));
}

TEST_CASE("restores count all their VMs against max_sandboxes; nothing is admitted once closed")
{
    Host host;
    host.live = 1;
    CHECK_FALSE(host.admission.admit_restores(1));
    const auto refused = host.admission.admit_restores(2);
    REQUIRE(refused);
    CHECK(refused->code == ServiceError::at_capacity);
    CHECK(refused->message == "1 VMs are running and 2 more would pass --max-sandboxes 2");
    host.available_mib = 0;
    CHECK(host.admission.admit_restores(1)->code == ServiceError::memory_reserve);
    host.admission.close();
    CHECK(host.admission.admit_restores(1)->code == ServiceError::draining);
    CHECK_FALSE(host.admission.refill_may_start());
}

TEST_CASE("refill yields to live demand: it starts nothing at max_sandboxes or under the reserve")
{
    Host host;
    CHECK(host.admission.refill_may_start());
    host.live = 2;
    CHECK_FALSE(host.admission.refill_may_start());
    host.live = 0;
    host.available_mib = 100;
    CHECK_FALSE(host.admission.refill_may_start());
    Admission unreadable(
        2, 0, []() -> uint64_t { throw Error("/proc/meminfo has no MemAvailable"); }, [] { return size_t{0}; });
    CHECK_THROWS_AS(unreadable.refill_may_start(), Error);
}

TEST_CASE("the manager refuses a create on the memory probe and at max_sandboxes, and counts both")
{
    // Never started: every create here is refused before a VM would be.
    const FakeAgentvm program("exit 1");
    ManagerConfig config;
    config.program = program.path;
    config.pools = {PoolConfig{"default", {}, 0, {}}};
    config.mem_reserve_mib = 2048;
    uint64_t available_mib = 100;
    HostProbes probes;
    probes.available_mib = [&] { return available_mib; };
    EventLoop loop;
    {
        SandboxManager manager(loop, config, probes);
        const auto refused = create_refusal(manager);
        REQUIRE(refused);
        CHECK(refused->code == ServiceError::memory_reserve);
        const std::string text = manager.metrics_text();
        CHECK(text.find("agentvm_create_refusals_total{code=\"memory_reserve\"} 1\n") != std::string::npos);
        CHECK(text.find("agentvm_host_memory_available_bytes 104857600\n") != std::string::npos);
        CHECK(text.find("agentvm_host_memory_reserve_bytes 2147483648\n") != std::string::npos);
    }
    config.max_sandboxes = 0;
    available_mib = 4096;
    SandboxManager manager(loop, config, probes);
    const auto refused = create_refusal(manager);
    REQUIRE(refused);
    CHECK(refused->code == ServiceError::at_capacity);
    CHECK(manager.metrics_text().find("agentvm_create_refusals_total{code=\"at_capacity\"} 1\n") != std::string::npos);
    CHECK(manager.sandboxes().empty());
}
