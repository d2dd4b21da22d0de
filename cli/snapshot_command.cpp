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

double ms_since(Clock::time_point start)
{
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

int run_bake(BakeOptions& options)
{
    const auto start = Clock::now();
    AgentVm agent_vm(options.vm, std::chrono::milliseconds(static_cast<int64_t>(options.boot_timeout_s * 1000)));
    Fd agent;
    double ready_ms = 0;
    // Once the agent answers, it is asked to close the connection, so that the snapshot holds
    // an idle agent and no half-open stream; its end-of-file is the moment to stop the VM.
    const auto on_connected = [&](Fd socket) {
        ready_ms = ms_since(start);
        spdlog::info("agent ready after {:.0f} ms; pausing the VM", ready_ms);
        agent = std::move(socket);
        const std::string close = to_line(Json{{"id", "agentvm-bake"}, {"op", "close"}});
        if (::write(agent.get(), close.data(), close.size()) != static_cast<ssize_t>(close.size()))
            throw_errno("asking the guest agent to close its connection");
        agent_vm.vm().event_loop().watch_readable(agent.get(), [&] {
            char buffer[4096];
            const ssize_t n = ::read(agent.get(), buffer, sizeof buffer);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
                agent_vm.vm().event_loop().unwatch(agent.get());
                agent_vm.finish("the agent is ready and idle");
            }
        });
    };
    const VmResult result = agent_vm.run(on_connected, [] {});
    if (result.outcome == VmOutcome::stopped)
        return exit_code::signal_base + agent_vm.stop_signal();
    if (result.outcome != VmOutcome::finished)
        throw Error(fmt::format("the guest did not get ready for a snapshot: {}", result.detail));

    const auto save_start = Clock::now();
    const SnapshotSummary summary = write_snapshot(agent_vm.kvm(), agent_vm.vm(), agent_vm.vm().config(), options.out);
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
    return {bake, [options] { return run_bake(*options); }};
}

} // namespace agentvm
