#include "service/plan/host_calibration.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "core/event_loop.hpp"
#include "core/loop_timer.hpp"
#include "service/episode_process.hpp"

namespace agentvm {
namespace {

using Clock = std::chrono::steady_clock;

// The episode's idle footprint settles once the resume's work is done.
constexpr auto settle_time = std::chrono::milliseconds(1000);
constexpr auto run_timeout = std::chrono::seconds(300);

std::vector<pid_t> process_tree(pid_t pid)
{
    std::vector<pid_t> tree{pid};
    std::ifstream children(fmt::format("/proc/{}/task/{}/children", pid, pid));
    for (pid_t child = 0; children >> child;) {
        const auto below = process_tree(child);
        tree.insert(tree.end(), below.begin(), below.end());
    }
    return tree;
}

// utime + stime of every process of the tree (all their threads), in seconds.
double cpu_seconds(pid_t root)
{
    double ticks = 0;
    for (pid_t pid : process_tree(root)) {
        std::ifstream stat(fmt::format("/proc/{}/stat", pid));
        std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
        const size_t paren = text.rfind(')');
        if (paren == std::string::npos)
            continue;
        std::istringstream fields(text.substr(paren + 2));
        std::string field;
        std::vector<std::string> values;
        while (fields >> field)
            values.push_back(field);
        if (values.size() > 12)
            ticks += std::stod(values[11]) + std::stod(values[12]);
    }
    return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// Private_Dirty of every process of the tree, in MiB.
double private_dirty_mib(pid_t root)
{
    double kib = 0;
    for (pid_t pid : process_tree(root)) {
        std::ifstream rollup(fmt::format("/proc/{}/smaps_rollup", pid));
        for (std::string line; std::getline(rollup, line);) {
            if (line.starts_with("Private_Dirty:"))
                kib += std::stod(line.substr(line.find_first_of("0123456789")));
        }
    }
    return kib / 1024;
}

double median(std::vector<double> values)
{
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
}

struct RunCosts {
    double restore_s;
    double restore_cpu_s;
    double idle_private_mib;
    double call_cpu_s;
    bool restored;
};

// One episode: ready, idle for a moment, `calls` sequential `exec true`, end of input.
RunCosts measure_one(const std::string& program, int calls)
{
    EventLoop loop;
    RunCosts costs{};
    std::optional<std::string> failure;
    const auto start = Clock::now();
    int answered = 0;
    double cpu_before_calls = 0;
    std::unique_ptr<EpisodeProcess> episode;
    LoopTimer settle(loop, [&] {
        costs.idle_private_mib = private_dirty_mib(episode->pid());
        cpu_before_calls = cpu_seconds(episode->pid());
        episode->send(fmt::format("{{\"id\":{},\"op\":\"exec\",\"argv\":[\"true\"]}}\n", answered));
    });
    LoopTimer deadline(loop, [&] {
        failure = fmt::format("the calibration episode did not finish within {} s", run_timeout.count());
        loop.stop();
    });
    episode = std::make_unique<EpisodeProcess>(
        loop, program, std::vector<std::string>{},
        EpisodeProcess::Handlers{
            [&](bool restored) {
                costs.restore_s = std::chrono::duration<double>(Clock::now() - start).count();
                costs.restore_cpu_s = cpu_seconds(episode->pid());
                costs.restored = restored;
                settle.arm(settle_time);
            },
            [&](std::string&& line) {
                if (line.find("\"exit_code\":0") == std::string::npos) {
                    failure = "a calibration call failed: " + line.substr(0, 300);
                    episode->kill();
                    return;
                }
                if (++answered < calls) {
                    episode->send(fmt::format("{{\"id\":{},\"op\":\"exec\",\"argv\":[\"true\"]}}\n", answered));
                    return;
                }
                costs.call_cpu_s = (cpu_seconds(episode->pid()) - cpu_before_calls) / calls;
                episode->close_input();
            },
            [&](const std::string& why) { failure = why; },
            [&](int status) {
                if (!failure && (answered < calls || status != 0))
                    failure = fmt::format("the calibration episode ended early: {}", episode->stderr_tail());
                loop.stop();
            }});
    deadline.arm(run_timeout);
    loop.run();
    if (failure)
        throw Error(*failure);
    return costs;
}

} // namespace

SandboxCosts calibrate(const std::string& program, int runs, int calls)
{
    std::vector<double> restore;
    std::vector<double> restore_cpu;
    std::vector<double> memory;
    std::vector<double> call_cpu;
    SandboxCosts costs;
    for (int i = 0; i < runs; ++i) {
        const RunCosts run = measure_one(program, calls);
        spdlog::info("calibration run {}/{}: ready in {:.0f} ms, {:.2f} MiB private idle, {:.2f} ms CPU per call",
                     i + 1, runs, run.restore_s * 1000, run.idle_private_mib, run.call_cpu_s * 1000);
        restore.push_back(run.restore_s);
        restore_cpu.push_back(run.restore_cpu_s);
        memory.push_back(run.idle_private_mib);
        call_cpu.push_back(run.call_cpu_s);
        costs.restored = run.restored;
    }
    costs.restore_s = median(restore);
    costs.restore_cpu_s = median(restore_cpu);
    costs.idle_private_mib = median(memory);
    costs.call_cpu_s = median(call_cpu);
    costs.runs = runs;
    return costs;
}

} // namespace agentvm
