// The manager's expiry sweep on an injected clock, with a shell script standing in for agentvm:
// a sandbox past its lifetime or idle time is removed and counted, and a paused sandbox past
// its retention is removed, without waiting for the time to pass.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "core/event_loop.hpp"
#include "core/loop_timer.hpp"
#include "service/sandbox_manager.hpp"
#include "tests/support/fake_agentvm.hpp"

using namespace agentvm;
using agentvm::test::FakeAgentvm;

namespace {

const char* const ready_episode = R"(echo '{"event":"ready","restored":false}'
exec sleep 60)";

// Runs the loop for `time`: the sweep runs every 250 ms.
void run_for(EventLoop& loop, std::chrono::milliseconds time)
{
    LoopTimer stop(loop, [&] { loop.stop(); });
    stop.arm(time);
    loop.run();
}

struct Rig {
    FakeAgentvm program{ready_episode};
    EventLoop loop;
    std::chrono::seconds ahead{0};  // how far the injected clocks are ahead of the host's
    std::optional<SandboxManager> manager;

    explicit Rig(const std::string& state_dir = {})
    {
        ManagerConfig config;
        config.program = program.path;
        config.pools = {PoolConfig{"default", {}, 0, {}}};
        config.mem_reserve_mib = 0;
        config.state_dir = state_dir;
        HostProbes probes;
        probes.now = [this] { return Sandbox::Clock::now() + ahead; };
        probes.wall_now = [this] { return std::chrono::system_clock::now() + ahead; };
        manager.emplace(loop, config, probes);
    }

    // A sandbox of the pool, cold-started, with `settings`; its id.
    std::string create(Sandbox::Settings settings)
    {
        std::string id;
        manager->create("default", std::move(settings), [&](Sandbox* sandbox, const Refusal*) {
            if (sandbox)
                id = sandbox->id();
            loop.stop();
        });
        LoopTimer deadline(loop, [&] { loop.stop(); });
        deadline.arm(std::chrono::seconds(10));
        loop.run();
        REQUIRE_FALSE(id.empty());
        return id;
    }

    bool metric(const std::string& line) const
    {
        return manager->metrics_text().find(line + "\n") != std::string::npos;
    }
};

} // namespace

TEST_CASE("a sandbox past its lifetime on the sweep's clock is removed and counted")
{
    Rig rig;
    Sandbox::Settings settings;
    settings.timeout = std::chrono::seconds(300);
    const std::string id = rig.create(settings);
    rig.ahead = std::chrono::seconds(299);
    run_for(rig.loop, std::chrono::milliseconds(400));
    REQUIRE(rig.manager->find(id));
    rig.ahead = std::chrono::seconds(301);
    run_for(rig.loop, std::chrono::milliseconds(400));
    CHECK_FALSE(rig.manager->find(id));
    CHECK(rig.manager->ended_reason(id) == "timeout");
    CHECK(rig.metric("agentvm_failures_total{kind=\"lifetime\"} 1"));
    CHECK(rig.metric("agentvm_failures_total{kind=\"idle\"} 0"));
}

TEST_CASE("a sandbox idle past its idle timeout on the sweep's clock is removed and counted")
{
    Rig rig;
    Sandbox::Settings settings;
    settings.idle_timeout = std::chrono::seconds(60);
    const std::string id = rig.create(settings);
    rig.ahead = std::chrono::seconds(61);
    run_for(rig.loop, std::chrono::milliseconds(400));
    CHECK_FALSE(rig.manager->find(id));
    CHECK(rig.manager->ended_reason(id) == "idle_timeout");
    CHECK(rig.metric("agentvm_failures_total{kind=\"idle\"} 1"));
}

TEST_CASE("a paused sandbox past its retention on the sweep's wall clock is removed")
{
    char name[] = "/tmp/agentvm-expiry-test-XXXXXX";
    REQUIRE(::mkdtemp(name) != nullptr);
    const std::string dir = name;
    const std::string snapshot = dir + "/snapshots/pause-sb-1-1-1";
    std::filesystem::create_directories(snapshot);
    std::filesystem::create_directories(dir + "/paused");
    std::ofstream(snapshot + "/manifest.json") << "{}";
    PausedSandbox record;
    record.settings.id = "sb-1";
    record.snapshot = snapshot;
    record.pool = "default";
    record.retain_until = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch() + std::chrono::hours(24))
                              .count();
    std::ofstream(dir + "/paused/sb-1.json") << record.to_json().dump();
    {
        Rig rig(dir);
        run_for(rig.loop, std::chrono::milliseconds(400));
        REQUIRE(rig.manager->find_paused("sb-1"));
        rig.ahead = std::chrono::hours(25);
        run_for(rig.loop, std::chrono::milliseconds(400));
        CHECK_FALSE(rig.manager->find_paused("sb-1"));
        CHECK(rig.manager->ended_reason("sb-1") == "paused past its retention (--paused-retention)");
        CHECK_FALSE(std::filesystem::exists(snapshot));
    }
    std::filesystem::remove_all(dir);
}
