// serve's episode children, with a shell script standing in for agentvm: the ready line, lines
// both ways, stdin's end, exit statuses, stderr kept, and no child left behind.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "core/event_loop.hpp"
#include "core/loop_timer.hpp"
#include "service/episode_process.hpp"
#include "tests/support/fake_agentvm.hpp"

using namespace agentvm;
using agentvm::test::FakeAgentvm;

namespace {

struct Run {
    EventLoop loop;
    std::optional<bool> restored;
    std::vector<std::string> lines;
    std::vector<std::string> broken;
    std::optional<int> status;
    std::optional<EpisodeProcess> episode;
    LoopTimer deadline{loop, [this] { loop.stop(); }};

    explicit Run(const std::string& program, std::vector<std::string> args = {})
    {
        episode.emplace(loop, program, args,
                        EpisodeProcess::Handlers{[this](bool r) { restored = r; },
                                                 [this](std::string&& line) { lines.push_back(line); },
                                                 [this](const std::string& why) { broken.push_back(why); },
                                                 [this](int s) {
                                                     status = s;
                                                     loop.stop();
                                                 }});
    }
    // Runs the loop until the child exits (or 10 s pass).
    void until_exit()
    {
        deadline.arm(std::chrono::seconds(10));
        loop.run();
    }
};

} // namespace

TEST_CASE("an episode child: ready line, lines both ways, end of stdin, exit status and stderr")
{
    const FakeAgentvm program(
        "[ \"$1 $2 $3\" = 'episode --announce-ready --cold' ] || exit 9\n"
        "echo '{\"event\":\"ready\",\"restored\":true}'\n"
        "while read -r line; do echo \"got $line\"; done\n"
        "echo 'agentvm: error: the end' >&2\n"
        "exit 3");
    Run run(program.path, {"--cold"});
    run.episode->send("one\n");
    run.episode->send("two\n");
    run.episode->close_input();
    run.until_exit();
    REQUIRE(run.status);
    CHECK(WIFEXITED(*run.status));
    CHECK(WEXITSTATUS(*run.status) == 3);
    CHECK(run.restored == std::optional<bool>(true));
    CHECK(run.lines == std::vector<std::string>{"got one", "got two"});
    CHECK(run.broken.empty());
    CHECK(run.episode->stderr_tail() == "agentvm: error: the end\n");
    CHECK_FALSE(run.episode->running());
}

TEST_CASE("an episode child that is killed is reaped with its signal")
{
    const FakeAgentvm program("echo '{\"event\":\"ready\",\"restored\":false}'; exec sleep 1000");
    Run run(program.path);
    run.episode->kill();
    run.until_exit();
    REQUIRE(run.status);
    CHECK(WIFSIGNALED(*run.status));
    CHECK(WTERMSIG(*run.status) == SIGKILL);
}

TEST_CASE("a first line that is not the announcement is reported once, and the child killed")
{
    const FakeAgentvm program("echo 'hello'; echo '{\"event\":\"ready\",\"restored\":true}'; exec sleep 1000");
    Run run(program.path);
    run.until_exit();
    CHECK_FALSE(run.restored);
    REQUIRE(run.broken.size() == 1);
    CHECK(run.broken[0].find("ready announcement") != std::string::npos);
    CHECK(run.lines.empty());
    REQUIRE(run.status);
    CHECK(WTERMSIG(*run.status) == SIGKILL);
}

TEST_CASE("a program that cannot be run exits 127 and says so on stderr")
{
    Run run("/nonexistent/agentvm");
    run.until_exit();
    REQUIRE(run.status);
    CHECK(WEXITSTATUS(*run.status) == 127);
    CHECK(run.episode->stderr_tail().find("cannot execute") != std::string::npos);
}

TEST_CASE("destroying a running episode kills and reaps its child")
{
    const FakeAgentvm program("exec sleep 1000");
    pid_t pid = 0;
    {
        Run run(program.path);
        pid = run.episode->pid();
        CHECK(::kill(pid, 0) == 0);
    }
    // Reaped, not a zombie: the pid is gone.
    CHECK(::kill(pid, 0) != 0);
    CHECK(errno == ESRCH);
}
