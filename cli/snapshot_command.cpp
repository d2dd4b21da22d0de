#include <CLI/CLI.hpp>

#include "cli/snapshot_command.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "cli/agent_vm.hpp"
#include "cli/exit_codes.hpp"
#include "cli/seconds_option.hpp"
#include "cli/supervised.hpp"
#include "cli/vm_options.hpp"
#include "protocol/agent_protocol.hpp"
#include "common/error.hpp"
#include "core/loop_timer.hpp"
#include "vmm/snapshot.hpp"

namespace agentvm {
namespace {

using Clock = std::chrono::steady_clock;

struct BakeOptions {
    VmOptions vm{VmRole::bake};
    std::string out;
    double boot_timeout_s = 60;
    bool json = false;
};

// The calls a bake runs before it pauses the guest: they load what every tool call needs (the
// agent's exec path, bash, libc) into the guest's page cache and caches, so that the snapshot
// holds them and restored VMs neither read them from disk nor dirty pages loading them. The
// first runs alone, under KVM's dirty log: the pages it writes are the snapshot's warm pages
// (vmm/warm_pages.hpp), those a restored VM's first call writes. The shell session's pages
// are left out: they are many, and an idle VM would carry them all (measured in the test host:
// 868 warm pages with it, idle VMs 4.1 MiB private instead of the 3 MiB we allow).
std::vector<Json> warm_up_calls()
{
    return {Json{{"id", "agentvm-warm-exec"}, {"op", "exec"}, {"argv", {"true"}}},
            Json{{"id", "agentvm-warm-shell"}, {"op", "shell"}, {"cmd", "true"}}};
}

constexpr const char* close_id = "agentvm-bake";

// Their answers and close's are three short lines; anything larger is not a working agent.
constexpr size_t max_warm_up_answers = 64 * 1024;

// After the agent has closed the connection, the guest still tears the warm-up calls down in
// the background (their processes' exit, their cgroups' removal, RCU callbacks). A snapshot
// taken before that is done makes every restore finish it first, before the guest can answer:
// in the test host, 662 nested page faults until a restored guest had handled the transport
// reset, 230 once the bake let it settle.
constexpr auto bake_settle = std::chrono::milliseconds(500);

// A few hundred bytes into a socket whose peer has read everything before: written whole.
void send_lines(int fd, const std::vector<Json>& calls)
{
    std::string lines;
    for (const Json& call : calls)
        lines += to_line(call);
    if (::write(fd, lines.data(), lines.size()) != static_cast<ssize_t>(lines.size()))
        throw_errno("sending the warm-up calls to the guest agent");
}

void check_warm_up_answers(const std::string& answers)
{
    size_t succeeded = 0;
    size_t begin = 0;
    for (size_t end; (end = answers.find('\n', begin)) != std::string::npos; begin = end + 1) {
        const Json answer = Json::parse(answers.substr(begin, end - begin), nullptr, false);
        if (answer.is_object() && answer.value("id", "") == close_id && answer.value("ok", false))
            continue;
        if (answer.is_object() && answer.value("exit_code", -1) == 0)
            ++succeeded;
        else
            throw Error("a warm-up call failed in the guest: " + answers.substr(begin, std::min<size_t>(end - begin, 300)));
    }
    if (succeeded != warm_up_calls().size())
        throw Error(fmt::format("the guest agent answered {} of {} warm-up calls", succeeded, warm_up_calls().size()));
}

double ms_since(Clock::time_point start)
{
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

int run_bake(BakeOptions& options)
{
    const auto start = Clock::now();
    AgentVm agent_vm(options.vm, seconds_to_ms(options.boot_timeout_s));
    const SnapshotWriter writer(agent_vm.kvm(), agent_vm.vm().config(), options.out);
    options.vm.keep_writable_dir(writer.parent_dir());
    Fd agent;
    double ready_ms = 0;
    std::string answers;
    LoopTimer settle(agent_vm.vm().event_loop(), [&] { agent_vm.finish("the agent is warm and idle"); });
    // Once the agent answers, it runs the warm-up calls and is asked to close the connection,
    // so that the snapshot holds an idle agent and no half-open stream; its end-of-file is the
    // moment to stop the VM.
    const auto on_connected = [&](Fd socket) {
        ready_ms = ms_since(start);
        spdlog::info("agent ready after {:.0f} ms; warming up, then pausing the VM", ready_ms);
        agent = std::move(socket);
        const std::vector<Json> calls = warm_up_calls();
        agent_vm.vm().start_write_log();
        send_lines(agent.get(), {calls.front()});
        agent_vm.vm().event_loop().watch_readable(agent.get(), [&, calls] {
            char buffer[4096];
            const ssize_t n = ::read(agent.get(), buffer, sizeof buffer);
            if (n > 0 && answers.size() + static_cast<size_t>(n) <= max_warm_up_answers) {
                const bool first_answered = answers.find('\n') != std::string::npos;
                answers.append(buffer, static_cast<size_t>(n));
                if (!first_answered && answers.find('\n') != std::string::npos) {
                    agent_vm.vm().stop_write_log();
                    std::vector<Json> rest(calls.begin() + 1, calls.end());
                    rest.push_back(Json{{"id", close_id}, {"op", "close"}});
                    send_lines(agent.get(), rest);
                }
                return;
            }
            if (n < 0 && (errno == EAGAIN || errno == EINTR))
                return;
            agent_vm.vm().event_loop().unwatch(agent.get());
            if (n != 0)
                agent_vm.fail("the guest agent's answers to the warm-up calls are not what it should send");
            else
                settle.arm(bake_settle);
        });
    };
    const VmResult result = agent_vm.run(on_connected, [] {});
    if (result.outcome == VmOutcome::stopped)
        return exit_code::signal_base + agent_vm.stop_signal();
    if (result.outcome != VmOutcome::finished)
        throw Error(fmt::format("the guest did not get ready for a snapshot: {}", result.detail));
    check_warm_up_answers(answers);

    const auto save_start = Clock::now();
    const SnapshotSummary summary = writer.write(agent_vm.vm());
    const double save_ms = ms_since(save_start);
    spdlog::info("snapshot written to '{}': {:.1f} MiB of memory, {:.1f} MiB of disk, {} bytes of state, in {:.0f} ms",
                 summary.dir, static_cast<double>(summary.memory_data_bytes) / 1048576.0,
                 static_cast<double>(summary.disk_data_bytes) / 1048576.0,
                 summary.state_bytes, save_ms);
    if (options.json) {
        const nlohmann::json report{{"dir", summary.dir},
                                    {"memory_data_bytes", summary.memory_data_bytes},
                                    {"disk_data_bytes", summary.disk_data_bytes},
                                    {"state_bytes", summary.state_bytes},
                                    {"ready_ms", ready_ms},
                                    {"save_ms", save_ms}};
        std::printf("%s\n", report.dump().c_str());
    }
    return exit_code::ok;
}

} // namespace

Subcommand add_snapshot_command(CLI::App& app)
{
    auto* snapshot = app.add_subcommand("snapshot", "Make snapshots that run and episode restore from");
    snapshot->require_subcommand(1);
    auto* bake = snapshot->add_subcommand(
        "bake", "Boot a VM, wait until its agent is ready and idle, and save it to a snapshot directory");
    auto options = std::make_shared<BakeOptions>();
    bake->add_option("--out", options->out, "the snapshot directory to create (must not exist)")->required();
    options->vm.add_to(*bake);
    bake->add_option("--boot-timeout", options->boot_timeout_s,
                     "seconds the guest agent gets to answer after the VM starts")
        ->capture_default_str()
        ->check(seconds_option());
    bake->add_flag("--json", options->json, "print a JSON summary on stdout");
    return {bake, [options] { return run_supervised(options->vm, 0, [&] { return run_bake(*options); }); }};
}

} // namespace agentvm
