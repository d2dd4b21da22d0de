#include "episode/bake_session.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "core/loop_timer.hpp"
#include "episode/agent_vm.hpp"
#include "episode/bake_calls.hpp"
#include "episode/exit_codes.hpp"
#include "episode/seconds.hpp"
#include "protocol/agent_protocol.hpp"
#include "vmm/snapshot.hpp"

namespace agentvm {
namespace {

using Clock = std::chrono::steady_clock;

// After the agent has closed the connection, the guest still tears the warm-up calls down in
// the background (their processes' exit, their cgroups' removal, RCU callbacks). A snapshot
// taken before that is done makes every restore finish it first, before the guest can answer:
// in the test host, 662 nested page faults until a restored guest had handled the transport
// reset, 230 once the bake let it settle.
constexpr auto bake_settle = std::chrono::milliseconds(500);

// A few hundred bytes into a socket whose peer has read everything before: written whole.
void send_line(int fd, const Json& call)
{
    const std::string line = to_line(call);
    if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
        throw_errno("sending a bake call to the guest agent");
}

double ms_since(Clock::time_point start)
{
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

} // namespace

int run_bake(BakeSettings& settings)
{
    const auto start = Clock::now();
    AgentVm agent_vm(settings.vm, seconds_to_ms(settings.boot_timeout_s));
    const SnapshotWriter writer(agent_vm.kvm(), agent_vm.vm().config(), settings.out);
    settings.vm.keep_writable_dir(writer.parent_dir());
    Fd agent;
    double ready_ms = 0;
    const std::vector<BakeCall> calls = bake_calls(settings.run, settings.warm_up, settings.step_timeout_s);
    size_t next = 0;        // the call to send once the one in flight is answered
    std::string pending;    // what the agent sent beyond the last whole line
    std::string failure;
    LoopTimer settle(agent_vm.vm().event_loop(), [&] { agent_vm.finish("the agent is warm and idle"); });
    const auto send_next = [&] {
        const BakeCall& call = calls[next++];
        if (call.log_writes)
            agent_vm.vm().start_write_log();
        spdlog::debug("bake: {}", call.what);
        send_line(agent.get(), call.call);
    };
    // Once the agent answers, the calls go one at a time, the last asking it to close the
    // connection, so that the snapshot holds an idle agent and no half-open stream; its
    // end-of-file is the moment to stop the VM.
    const auto on_connected = [&](Fd socket) {
        ready_ms = ms_since(start);
        spdlog::info("agent ready after {:.0f} ms; {} before pausing the VM", ready_ms,
                     settings.run.empty() && settings.warm_up.empty() ? "warming up" : "running the steps");
        agent = std::move(socket);
        send_next();
        agent_vm.vm().event_loop().watch_readable(agent.get(), [&] {
            char buffer[65536];
            const ssize_t n = ::read(agent.get(), buffer, sizeof buffer);
            if (n < 0 && (errno == EAGAIN || errno == EINTR))
                return;
            if (n <= 0) {
                agent_vm.vm().event_loop().unwatch(agent.get());
                if (n == 0 && next == calls.size() && pending.empty())
                    settle.arm(bake_settle);
                else
                    agent_vm.fail(failure.empty() ? "the guest agent closed the connection before the bake was done" : failure);
                return;
            }
            pending.append(buffer, static_cast<size_t>(n));
            for (size_t newline; (newline = pending.find('\n')) != std::string::npos;) {
                const std::string line = pending.substr(0, newline);
                pending.erase(0, newline + 1);
                const BakeCall& answered = calls[next - 1];
                if (answered.log_writes)
                    agent_vm.vm().stop_write_log();
                failure = failure_of(answered, line);
                if (!failure.empty()) {
                    agent_vm.vm().event_loop().unwatch(agent.get());
                    agent_vm.fail(failure);
                    return;
                }
                if (!answered.closes) {
                    spdlog::debug("bake: {} done after {:.0f} ms", answered.what, ms_since(start));
                    send_next();
                }
            }
            if (pending.size() > max_bake_answer_line) {
                agent_vm.vm().event_loop().unwatch(agent.get());
                agent_vm.fail("the guest agent sent an answer line longer than a bake call's");
            }
        });
    };
    const VmResult result = agent_vm.run(on_connected, [] {});
    if (result.outcome == VmOutcome::stopped)
        return exit_code::signal_base + agent_vm.stop_signal();
    if (!failure.empty())
        throw Error(failure);
    if (result.outcome != VmOutcome::finished)
        throw Error(fmt::format("the guest did not get ready for a snapshot: {}", result.detail));

    const auto save_start = Clock::now();
    const SnapshotSummary summary = writer.write(agent_vm.vm());
    const double save_ms = ms_since(save_start);
    spdlog::info("snapshot written to '{}': {:.1f} MiB of memory, {:.1f} MiB of disk, {} bytes of state, in {:.0f} ms",
                 summary.dir, static_cast<double>(summary.memory_data_bytes) / 1048576.0,
                 static_cast<double>(summary.disk_data_bytes) / 1048576.0,
                 summary.state_bytes, save_ms);
    if (settings.json) {
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

} // namespace agentvm
