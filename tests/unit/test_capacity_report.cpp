// What serve tells the balancer (service/fleet/capacity_report.hpp): the weight formula, its
// 0% exactly where admission refuses a create, warm VMs weighing more than cold room, drain
// and maint with their agent-check lines, and /healthz's JSON; then, through a manager whose
// VMs fail to start (FakeAgentvm), maint reached and left again.
#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <string>

#include "core/event_loop.hpp"
#include "core/loop_timer.hpp"
#include "service/fleet/capacity_report.hpp"
#include "service/sandbox_manager.hpp"
#include "tests/support/fake_agentvm.hpp"

using namespace agentvm;
using agentvm::test::FakeAgentvm;
using namespace std::chrono_literals;

namespace {

CapacityInputs idle_node()
{
    CapacityInputs in;
    in.node_id = "node-a";
    in.max_sandboxes = 64;
    in.warm_target = 2;
    in.warm = 2;
    in.running = 2;
    in.available_mib = 8192;
    in.reserve_mib = 1024;
    in.pools = {PoolStarts{"default", 0, {}}};
    in.now = std::chrono::steady_clock::time_point{} + 1h;
    return in;
}

} // namespace

TEST_CASE("an idle node with full pools is 100%, and the weight falls as sandboxes are handed out")
{
    CapacityInputs in = idle_node();
    CHECK(capacity_weight(in) == 100);
    CHECK(capacity_report(in).agent_line() == "ready up 100%\n");
    unsigned last = 100;
    // Each create takes a warm VM that refill replaces: running grows by one each time.
    for (size_t handed_out = 1; handed_out <= 62; ++handed_out) {
        in.running = handed_out + 2;
        const unsigned weight = capacity_weight(in);
        CHECK(weight <= last);
        CHECK(weight >= 1);
        last = weight;
    }
    CHECK(last < 20);
    // Every place taken and no warm VM left: no create would be admitted.
    in.running = 64;
    in.warm = 0;
    CHECK(capacity_weight(in) == 0);
    CHECK(capacity_report(in).agent_line() == "ready up 0%\n");
    CHECK(capacity_report(in).status == NodeStatus::ok);
}

TEST_CASE("warm VMs weigh more than cold room")
{
    CapacityInputs warm = idle_node();
    CapacityInputs cold = idle_node();
    cold.warm = 0;
    cold.running = 0;  // the same free places, its pool not yet refilled
    CHECK(capacity_weight(warm) > capacity_weight(cold));
    CHECK(capacity_weight(cold) == 91);  // 64 / 70

    // Nearly full: two warm VMs left beat two cold places.
    warm.running = 64;
    cold.running = 62;
    CHECK(capacity_weight(cold) == 3);  // 2 / 70
    CHECK(capacity_weight(warm) == 11); // 8 / 70
}

TEST_CASE("0% exactly when no create would be admitted")
{
    CapacityInputs in = idle_node();
    in.warm = 0;
    in.running = 10;
    in.available_mib = 1023;  // under the reserve: no cold start
    CHECK(capacity_weight(in) == 0);
    in.available_mib = 1024;
    CHECK(capacity_weight(in) > 0);
    // Under the reserve a warm VM is still handed out (admission does not ask memory then).
    in.available_mib = 0;
    in.warm = 1;
    CHECK(capacity_weight(in) > 0);
    // A single free place is never rounded away to 0%.
    CapacityInputs big = idle_node();
    big.max_sandboxes = 100000;
    big.warm = 0;
    big.running = 99999;
    CHECK(capacity_weight(big) == 1);
    // More running than the limit (lowered across a restart): no room, no underflow.
    big.running = 200000;
    CHECK(capacity_weight(big) == 0);
    // No pools with a target: the cold places alone are the whole.
    CapacityInputs none = idle_node();
    none.warm = none.warm_target = 0;
    none.running = 16;
    CHECK(capacity_weight(none) == 75);
}

TEST_CASE("draining says drain, whatever the room")
{
    CapacityInputs in = idle_node();
    in.draining = true;
    const CapacityReport report = capacity_report(in);
    CHECK(report.status == NodeStatus::draining);
    CHECK(report.weight == 0);
    CHECK(report.agent_line() == "drain\n");
    CHECK(report.http_status() == 503);
    CHECK(report.json()["status"] == "draining");
}

TEST_CASE("maint: the last starts of every pool failed, and recently")
{
    CapacityInputs in = idle_node();
    in.pools = {PoolStarts{"default", maint_after_failures, in.now - 1s},
                PoolStarts{"big", maint_after_failures - 1, in.now - 1s}};
    CHECK(capacity_report(in).status == NodeStatus::ok);  // one pool still starts (or may)
    in.pools[1].failed_in_row = maint_after_failures + 4;
    CapacityReport report = capacity_report(in);
    CHECK(report.status == NodeStatus::maint);
    CHECK(report.weight == 0);
    CHECK(report.http_status() == 503);
    const std::string line = report.agent_line();
    CHECK(line.rfind("maint fail #", 0) == 0);
    CHECK(line.find("default 3") != std::string::npos);
    CHECK(line.find("big 7") != std::string::npos);
    CHECK(line.find('\n') == line.size() - 1);
    CHECK(report.json()["status"] == "maint");
    CHECK(report.json()["reason"] == report.reason);
    // Long enough since the last failure: offered again, so that a create can probe it.
    in.now += maint_probe_after;
    CHECK(capacity_report(in).status == NodeStatus::ok);
    // Draining outranks maint.
    in.now -= 1s;
    in.draining = true;
    CHECK(capacity_report(in).agent_line() == "drain\n");
}

TEST_CASE("the maint reason stays one short line whatever a pool is called")
{
    CapacityInputs in = idle_node();
    in.pools = {PoolStarts{std::string("/snap\r\nshots/") + std::string(400, 'x'), 5, in.now}};
    const std::string line = capacity_report(in).agent_line();
    CHECK(line.find('\r') == std::string::npos);
    CHECK(line.find('\n') == line.size() - 1);
    CHECK(line.size() < 200);
}

TEST_CASE("/healthz's JSON")
{
    CapacityInputs in = idle_node();
    in.running = 5;
    in.warm = 1;
    const Json doc = capacity_report(in).json();
    CHECK(doc["status"] == "ok");
    CHECK(doc["node"] == "node-a");
    CHECK(doc["weight"] == capacity_weight(in));
    CHECK(doc["warm"] == 1);
    CHECK(doc["running"] == 5);
    CHECK(doc["max_sandboxes"] == 64);
    CHECK(doc["available_mib"] == 8192);
    CHECK(doc["reserve_mib"] == 1024);
    CHECK(!doc.contains("reason"));
    CHECK(capacity_report(in).http_status() == 200);
}

TEST_CASE("through the manager: VM starts that fail put the node in maint, a start that works takes it out")
{
    // The episode fails to start until the test drops a file beside it.
    const FakeAgentvm program(R"(d=$(dirname "$0")
[ -e "$d/works" ] || exit 1
echo '{"event":"ready","restored":false}'
read request)");
    ManagerConfig config;
    config.program = program.path;
    config.node_id = "node-b";
    config.pools = {PoolConfig{"default", {}, 0, {}}};
    config.max_sandboxes = 4;
    config.mem_reserve_mib = 0;
    auto now = std::chrono::steady_clock::time_point{} + 1h;
    HostProbes probes;
    probes.now = [&now] { return now; };
    probes.available_mib = [] { return uint64_t{4096}; };
    EventLoop loop;
    SandboxManager manager(loop, config, probes);

    CapacityReport report = capacity_report(manager.capacity_inputs());
    CHECK(report.status == NodeStatus::ok);
    CHECK(report.weight == 100);
    CHECK(report.node_id == "node-b");

    auto create = [&] {
        bool answered = false;
        Sandbox* created = nullptr;
        manager.create("default", Sandbox::Settings{}, [&](Sandbox* sandbox, const Refusal*) {
            answered = true;
            created = sandbox;
        });
        const auto deadline = Sandbox::Clock::now() + std::chrono::seconds(10);
        std::optional<LoopTimer> poll;
        poll.emplace(loop, [&] {
            if (answered || Sandbox::Clock::now() > deadline)
                return loop.stop();
            poll->arm(std::chrono::milliseconds(5));
        });
        poll->arm(std::chrono::milliseconds(1));
        loop.run();
        REQUIRE(answered);
        return created;
    };
    for (unsigned i = 1; i < maint_after_failures; ++i) {
        CHECK(create() == nullptr);
        CHECK(capacity_report(manager.capacity_inputs()).status == NodeStatus::ok);
    }
    CHECK(create() == nullptr);
    report = capacity_report(manager.capacity_inputs());
    CHECK(report.status == NodeStatus::maint);
    CHECK(report.agent_line().rfind("maint fail #", 0) == 0);

    // A minute on, the node is offered again; a create that fails puts it back at once.
    now += maint_probe_after;
    CHECK(capacity_report(manager.capacity_inputs()).status == NodeStatus::ok);
    CHECK(create() == nullptr);
    CHECK(capacity_report(manager.capacity_inputs()).status == NodeStatus::maint);

    // One start that works ends maint, and the sandbox it made takes a place.
    std::ofstream(program.dir + "/works") << "\n";
    Sandbox* sandbox = create();
    REQUIRE(sandbox != nullptr);
    report = capacity_report(manager.capacity_inputs());
    CHECK(report.status == NodeStatus::ok);
    CHECK(report.running == 1);
    CHECK(report.weight == 75);
    CHECK(report.agent_line() == "ready up 75%\n");
    manager.remove(*sandbox, "test over");
}
