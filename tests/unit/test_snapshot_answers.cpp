// serve's fork and pause against an episode that answers its snapshot calls as a hostile guest
// would have them answered (a shell script stands in for agentvm): a path outside the VM's
// outbox is refused, a manifest naming a parent outside snapshots/ holds nothing, and neither
// touches anything else in the state directory.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>

#include "core/event_loop.hpp"
#include "core/loop_timer.hpp"
#include "service/sandbox_manager.hpp"
#include "tests/support/fake_agentvm.hpp"

using namespace agentvm;
using agentvm::test::FakeAgentvm;
namespace fs = std::filesystem;

namespace {

// Answers every call; a snapshot call as the file `mode` beside it says: "forged" names the
// state directory's snapshots/.. as the snapshot; "bad-parent" writes the snapshot it was
// asked for, with a manifest whose parent is snapshots/..
const char* const episode = R"sh(outbox=
while [ $# -gt 0 ]; do [ "$1" = --snapshot-dir ] && outbox=$2; shift; done
state=${outbox%/outbox/*}
echo '{"event":"ready","restored":true}'
while read -r line; do
  id=${line#*\"id\":}; id=${id%%,*}
  case "$line" in
  *'"op":"snapshot"'*)
    name=${line#*\"name\":\"}; name=${name%%\"*}
    if [ "$(cat "$(dirname "$0")/mode")" = forged ]; then
      echo "{\"id\":$id,\"snapshot\":{\"path\":\"$state/snapshots/..\"}}"
    else
      mkdir "$outbox/$name"
      echo "{\"parent\":{\"dir\":\"$state/snapshots/..\"}}" > "$outbox/$name/manifest.json"
      echo "{\"id\":$id,\"snapshot\":{\"path\":\"$outbox/$name\"}}"
    fi;;
  *) echo "{\"id\":$id,\"exit_code\":0}";;
  esac
done)sh";

struct Outcome {
    std::optional<Refusal> refusal;
    bool paused = false;
};

// Creates a sandbox from the pool and pauses it, on the loop; what the pause answered.
Outcome create_and_pause(EventLoop& loop, SandboxManager& manager)
{
    Outcome outcome;
    LoopTimer deadline(loop, [&] { loop.stop(); });
    deadline.arm(std::chrono::seconds(20));
    std::function<void()> try_create;
    LoopTimer retry(loop, [&] { try_create(); });
    try_create = [&] {
        manager.create("default", Sandbox::Settings{}, [&](Sandbox* sandbox, const Refusal*) {
            if (!sandbox)
                return retry.arm(std::chrono::milliseconds(50));
            manager.pause(*sandbox, [&](const PausedSandbox* paused, const Refusal* refusal) {
                outcome.paused = paused != nullptr;
                if (refusal)
                    outcome.refusal = *refusal;
                loop.stop();
            });
        });
    };
    retry.arm(std::chrono::milliseconds(100));
    loop.run();
    return outcome;
}

void check_untouched(const fs::path& state)
{
    CHECK(fs::exists(state / "lock"));
    CHECK(fs::exists(state / "precious"));
    CHECK(fs::is_directory(state / "snapshots"));
    CHECK(fs::is_directory(state / "paused"));
}

} // namespace

TEST_CASE("a forged snapshot answer is refused, and a forged parent holds nothing; the state directory stays")
{
    const FakeAgentvm program(episode);
    char dir[] = "/tmp/agentvm-answers-test-XXXXXX";
    REQUIRE(::mkdtemp(dir) != nullptr);
    const fs::path state = fs::path(dir) / "state";
    ManagerConfig config;
    config.program = program.path;
    config.pools = {PoolConfig{"default", {}, 1, {}}};
    config.mem_reserve_mib = 0;
    config.state_dir = state.string();
    {
        EventLoop loop;
        SandboxManager manager(loop, config);
        std::ofstream(state / "precious") << "outside snapshots/";

        std::ofstream(fs::path(program.dir) / "mode") << "forged";
        const Outcome forged = create_and_pause(loop, manager);
        CHECK_FALSE(forged.paused);
        REQUIRE(forged.refusal);
        CHECK(forged.refusal->code == ServiceError::snapshot_failed);
        CHECK(forged.refusal->message.find("not the") != std::string::npos);
        check_untouched(state);

        std::ofstream(fs::path(program.dir) / "mode") << "bad-parent";
        const Outcome bad_parent = create_and_pause(loop, manager);
        REQUIRE(bad_parent.paused);
        REQUIRE(manager.paused().size() == 1);
        const std::string snapshot = manager.paused().front()->snapshot;
        CHECK(fs::path(snapshot).parent_path() == state / "snapshots");
        manager.remove_paused(manager.paused().front()->settings.id, "test");
        CHECK_FALSE(fs::exists(snapshot));
        check_untouched(state);
    }
    fs::remove_all(dir);
}
