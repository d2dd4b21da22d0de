// The sandbox manager's resume, with a shell script standing in for agentvm: a DELETE that
// arrives while a paused sandbox's VM is being restored is answered "deleted", so that VM must
// not then run on under the id; and the pool of VMs restored from a snapshot is forgotten
// once none of its VMs is left.
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

// A state directory holding one paused sandbox, `id`, with a snapshot of its own.
struct PausedState {
    std::string dir;
    explicit PausedState(const std::string& id)
    {
        char name[] = "/tmp/agentvm-manager-test-XXXXXX";
        REQUIRE(::mkdtemp(name) != nullptr);
        dir = name;
        const std::string snapshot = dir + "/snapshots/pause-" + id + "-1-1";
        std::filesystem::create_directories(snapshot);
        std::filesystem::create_directories(dir + "/paused");
        std::ofstream(snapshot + "/manifest.json") << "{}";
        PausedSandbox record;
        record.settings.id = id;
        record.snapshot = snapshot;
        record.pool = "default";
        record.retain_until = 4102444800;  // 2100
        std::ofstream(dir + "/paused/" + id + ".json") << record.to_json().dump();
    }
    ~PausedState() { std::filesystem::remove_all(dir); }
};

ManagerConfig config_for(const FakeAgentvm& program, const PausedState& state)
{
    ManagerConfig config;
    config.program = program.path;
    config.mem_reserve_mib = 0;
    config.state_dir = state.dir;
    return config;
}

// Runs the loop for `time`.
void run_for(EventLoop& loop, std::chrono::milliseconds time)
{
    LoopTimer stop(loop, [&] { loop.stop(); });
    stop.arm(time);
    loop.run();
}

// An episode that is ready after a moment and runs until it is stopped.
const char* slow_episode = R"(sleep 0.3
echo '{"event":"ready","restored":true}'
read request)";

} // namespace

TEST_CASE("a paused sandbox deleted while it resumes does not run on, and its restore pool goes with it")
{
    const FakeAgentvm program(slow_episode);
    const PausedState state("sb-1");
    EventLoop loop;
    SandboxManager manager(loop, config_for(program, state));
    REQUIRE(manager.find_paused("sb-1"));

    std::optional<std::string> outcome;
    manager.resume("sb-1", [&](Sandbox* sandbox, const Refusal* refusal) {
        outcome = sandbox ? std::string("resumed") : std::string(error_name(refusal->code));
    });
    CHECK(manager.restore_pools() == 1);
    // The API answers this DELETE "deleted" (NativeApi::paused_request).
    manager.remove_paused("sb-1", "deleted");
    run_for(loop, std::chrono::milliseconds(2000));

    REQUIRE(outcome);
    CHECK(*outcome == "ended");
    CHECK(manager.find("sb-1") == nullptr);
    CHECK(manager.sandboxes().empty());
    CHECK(manager.ended_reason("sb-1") == "deleted");
    CHECK(manager.restore_pools() == 0);
}

TEST_CASE("a resumed sandbox runs under its id; its restore pool is forgotten once it has ended")
{
    const FakeAgentvm program(slow_episode);
    const PausedState state("sb-2");
    EventLoop loop;
    SandboxManager manager(loop, config_for(program, state));

    std::optional<std::string> outcome;
    manager.resume("sb-2", [&](Sandbox* sandbox, const Refusal* refusal) {
        outcome = sandbox ? std::string("resumed") : std::string(error_name(refusal->code));
    });
    run_for(loop, std::chrono::milliseconds(1500));
    REQUIRE(outcome);
    CHECK(*outcome == "resumed");
    const auto sandbox = manager.find("sb-2");
    REQUIRE(sandbox);
    CHECK(manager.restore_pools() == 1);
    manager.remove(*sandbox, "deleted");
    run_for(loop, std::chrono::milliseconds(1500));
    CHECK(manager.sandboxes().empty());
    CHECK(manager.restore_pools() == 0);
}
