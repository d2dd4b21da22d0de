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
#include "cli/supervised.hpp"
#include "cli/vm_options.hpp"
#include "guest/agent/protocol.hpp"
#include "vmm/error.hpp"
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
// holds them and restored VMs neither read them from disk nor dirty pages loading them.
std::vector<Json> warm_up_calls()
{
    return {Json{{"id", "agentvm-warm-exec"}, {"op", "exec"}, {"argv", {"true"}}},
            Json{{"id", "agentvm-warm-shell"}, {"op", "shell"}, {"cmd", "true"}}};
}

constexpr const char* close_id = "agentvm-bake";

// Their answers and close's are three short lines; anything larger is not a working agent.
constexpr size_t max_warm_up_answers = 64 * 1024;

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
    AgentVm agent_vm(options.vm, std::chrono::milliseconds(static_cast<int64_t>(options.boot_timeout_s * 1000)));
    const SnapshotWriter writer(agent_vm.kvm(), agent_vm.vm().config(), options.out);
    options.vm.keep_writable_dir(writer.parent_dir());
    Fd agent;
    double ready_ms = 0;
    std::string answers;
    // Once the agent answers, it runs the warm-up calls and is asked to close the connection,
    // so that the snapshot holds an idle agent and no half-open stream; its end-of-file is the
    // moment to stop the VM.
    const auto on_connected = [&](Fd socket) {
        ready_ms = ms_since(start);
        spdlog::info("agent ready after {:.0f} ms; warming up, then pausing the VM", ready_ms);
        agent = std::move(socket);
        std::string requests;
        for (const Json& call : warm_up_calls())
            requests += to_line(call);
        requests += to_line(Json{{"id", close_id}, {"op", "close"}});
        // A few hundred bytes into a fresh socket's empty buffer: written whole at once.
        if (::write(agent.get(), requests.data(), requests.size()) != static_cast<ssize_t>(requests.size()))
            throw_errno("sending the warm-up calls to the guest agent");
        agent_vm.vm().event_loop().watch_readable(agent.get(), [&] {
            char buffer[4096];
            const ssize_t n = ::read(agent.get(), buffer, sizeof buffer);
            if (n > 0 && answers.size() + static_cast<size_t>(n) <= max_warm_up_answers) {
                answers.append(buffer, static_cast<size_t>(n));
                return;
            }
            if (n < 0 && (errno == EAGAIN || errno == EINTR))
                return;
            agent_vm.vm().event_loop().unwatch(agent.get());
            if (n != 0)
                agent_vm.fail("the guest agent's answers to the warm-up calls are not what it should send");
            else
                agent_vm.finish("the agent is warm and idle");
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
        ->check(CLI::PositiveNumber);
    bake->add_flag("--json", options->json, "print a JSON summary on stdout");
    return {bake, [options] { return run_supervised(options->vm, 0, [&] { return run_bake(*options); }); }};
}

} // namespace agentvm
