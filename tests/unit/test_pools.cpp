// The pools' refill against a shell script standing in for agentvm, on an injected clock: at
// most refill_concurrency starts at once, up to the pool's target and never past what
// admission allows; a failed start backs the pool's refill off (0.5 s, doubling), counted on
// the clock; a create takes a warm VM and another pool's warm VM gives way for one.
#include <doctest/doctest.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/event_loop.hpp"
#include "core/loop_timer.hpp"
#include "service/admission.hpp"
#include "service/pools.hpp"
#include "tests/support/fake_agentvm.hpp"

using namespace agentvm;
using agentvm::test::FakeAgentvm;

namespace {

const char* const ready_episode = R"(echo '{"event":"ready","restored":true}'
exec sleep 60)";

// The manager's part in the pools' life, as a test can play it: VMs started and reported.
struct Rig {
    EventLoop loop;
    FakeAgentvm program;
    uint64_t available_mib = 4096;
    Sandbox::Clock::time_point now = Sandbox::Clock::now();
    std::map<Sandbox*, std::shared_ptr<Sandbox>> vms;
    std::vector<std::shared_ptr<Sandbox>> ended;  // a sandbox is not destroyed in its own hook
    unsigned starts = 0;
    Admission admission;
    Pools pools;

    Rig(const char* episode, std::vector<PoolConfig> configs, unsigned refill_concurrency, unsigned max_sandboxes = 8)
        : program(episode), admission(max_sandboxes, 1024, [this] { return available_mib; }, [this] { return live(); }),
          pools(
              configs, refill_concurrency, false, admission, [this](Pool& pool) { start(pool); },
              [this] { return now; })
    {
    }

    size_t live() const
    {
        size_t count = 0;
        for (const auto& [pointer, vm] : vms)
            count += vm->stopping() ? 0 : 1;
        return count;
    }

    void start(Pool& pool)
    {
        ++starts;
        auto sandbox = std::make_shared<Sandbox>(
            loop, pool.config.name, program.path, std::vector<std::string>{}, 16,
            Sandbox::Hooks{[this, &pool](Sandbox& s, bool) { pools.refill_ready(pool, vms.at(&s)); },
                           [this, &pool](Sandbox& s, const std::string&) {
                               if (!s.ready())
                                   pools.refill_failed(pool);
                               pools.vm_ended(pool, s);
                               ended.push_back(vms.at(&s));
                               vms.erase(&s);
                           },
                           {}});
        pools.vm_started(pool);
        vms[sandbox.get()] = sandbox;
    }

    // Runs the loop until `done` holds, or for at most 10 s.
    void run_until(const std::function<bool()>& done)
    {
        const auto deadline = Sandbox::Clock::now() + std::chrono::seconds(10);
        std::optional<LoopTimer> poll;
        poll.emplace(loop, [&] {
            if (done() || Sandbox::Clock::now() > deadline)
                return loop.stop();
            poll->arm(std::chrono::milliseconds(10));
        });
        poll->arm(std::chrono::milliseconds(1));
        loop.run();
        REQUIRE(done());
    }

    Pool& pool(const std::string& name) { return *pools.find(name); }
};

} // namespace

TEST_CASE("refill starts at most refill_concurrency VMs at once, up to the pool's target")
{
    Rig rig(ready_episode, {PoolConfig{"default", {}, 3, {}}}, 2);
    rig.pools.refill();
    CHECK(rig.pool("default").starting == 2);
    CHECK(rig.starts == 2);
    rig.pools.refill();
    CHECK(rig.starts == 2);
    rig.run_until([&] { return rig.pool("default").warm.size() == 3; });
    CHECK(rig.starts == 3);
    CHECK(rig.pool("default").starting == 0);
    rig.pools.refill();
    CHECK(rig.starts == 3);
}

TEST_CASE("refill never starts a VM past max_sandboxes or into the memory reserve")
{
    Rig rig(ready_episode, {PoolConfig{"default", {}, 3, {}}}, 3, 2);
    rig.available_mib = 1000;
    rig.pools.refill();
    CHECK(rig.starts == 0);
    rig.available_mib = 4096;
    rig.pools.refill();
    CHECK(rig.starts == 2);
    rig.run_until([&] { return rig.pool("default").warm.size() == 2; });
    rig.pools.refill();
    CHECK(rig.starts == 2);
}

TEST_CASE("a failed start backs the pool's refill off, doubling, on the pool's clock")
{
    Rig rig("exit 1", {PoolConfig{"default", {}, 1, {}}}, 1);
    rig.pools.refill();
    CHECK(rig.starts == 1);
    rig.run_until([&] { return rig.vms.empty(); });
    Pool& pool = rig.pool("default");
    CHECK(pool.failures_in_row == 1);
    CHECK(pool.starting == 0);
    rig.pools.refill();
    CHECK(rig.starts == 1);
    rig.now += std::chrono::milliseconds(499);
    rig.pools.refill();
    CHECK(rig.starts == 1);
    rig.now += std::chrono::milliseconds(1);
    rig.pools.refill();
    CHECK(rig.starts == 2);
    rig.run_until([&] { return rig.vms.empty(); });
    CHECK(pool.failures_in_row == 2);
    rig.now += std::chrono::milliseconds(999);
    rig.pools.refill();
    CHECK(rig.starts == 2);
    rig.now += std::chrono::milliseconds(1);
    rig.pools.refill();
    CHECK(rig.starts == 3);
    rig.run_until([&] { return rig.vms.empty(); });
}

TEST_CASE("a create takes a warm VM; another pool's warm VM gives way for a create; drain stops the rest")
{
    Rig rig(ready_episode, {PoolConfig{"a", {}, 1, {}}, PoolConfig{"b", {}, 2, {}}}, 3);
    rig.pools.refill();
    rig.run_until([&] { return rig.pool("a").warm.size() == 1 && rig.pool("b").warm.size() == 2; });
    CHECK(rig.pools.default_pool() == "default");
    CHECK(rig.pools.names() == std::vector<std::string>{"a", "b"});

    Sandbox* taken = rig.pools.take_warm(rig.pool("a"));
    REQUIRE(taken);
    CHECK(rig.pool("a").warm.empty());
    CHECK_FALSE(rig.pools.take_warm(rig.pool("a")));

    CHECK(rig.pools.evict_spare(rig.pool("a")));
    CHECK(rig.pool("b").warm.size() == 1);
    CHECK(rig.live() == 2);

    rig.admission.close();
    rig.pools.drain();
    CHECK(rig.pool("b").warm.empty());
    CHECK(rig.live() == 1);  // the one handed out runs on
    taken->stop("test");
    rig.run_until([&] { return rig.vms.empty(); });
    rig.pools.refill();
    CHECK(rig.starts == 3);
}
