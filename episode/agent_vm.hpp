// What `agentvm run` and `agentvm episode` share: a VM whose guest does nothing but serve
// tool calls, the connection to its agent, and the stop paths (signals, boot deadline).
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "episode/agent_link.hpp"
#include "episode/stop_signals.hpp"
#include "episode/vm_options.hpp"
#include "vmm/kvm.hpp"
#include "vmm/snapshot.hpp"
#include "vmm/vm.hpp"

namespace agentvm {

class AgentVm {
public:
    // Checks the options and the host, then builds the VM, restored from a snapshot where
    // the options say so (VmOptions::snapshot_dir), within the options' cgroup limits. Throws
    // Error naming the problem; nothing has run and nothing is left behind then. `options`
    // must outlive this.
    AgentVm(VmOptions& options, std::chrono::milliseconds boot_timeout);
    AgentVm(const AgentVm&) = delete;
    AgentVm& operator=(const AgentVm&) = delete;

    Vm& vm() { return *vm_; }
    const Kvm& kvm() const { return *kvm_; }

    // Jails the process (unless --no-jail), then runs the VM until it stops, or until the
    // episode's time limit fails it. on_connected gets the agent's socket once it answers (on
    // the loop's thread); on_stopping runs when the loop is about to stop (Vm::on_stopping).
    // A guest whose agent never answers within the boot timeout is stopped as failed.
    VmResult run(std::function<void(Fd agent)> on_connected, std::function<void()> on_stopping);
    // The command is done with the VM: thread-safe, ends run() with VmOutcome::finished.
    void finish(const std::string& why) { vm_->stop(VmOutcome::finished, why); }
    // Ends run() with VmOutcome::failed.
    void fail(const std::string& why) { vm_->stop(VmOutcome::failed, why); }
    // The agent's connection broke: fail(why), but only after a moment in which the VM may
    // end by itself, since a guest that powers off or reboots drops its connections first;
    // that way the reported cause is the real one. On the loop's thread.
    void fail_unless_vm_ends(const std::string& why);
    int stop_signal() const { return signals_.received(); }
    // Whether the VM was restored from a snapshot rather than booted.
    bool restored() const { return restored_; }
    // The snapshot it was restored from, for its live snapshots; none when it booted.
    const std::optional<SnapshotOrigin>& origin() const { return origin_; }
    // Whether the episode's time limit (--episode-timeout) is what ended run().
    bool time_ran_out() const { return time_ran_out_; }

private:
    VmOptions& options_;
    std::optional<Kvm> kvm_;
    StopSignals signals_;
    std::optional<Vm> vm_;
    std::optional<AgentLink> link_;
    std::optional<LoopTimer> grace_;
    std::optional<LoopTimer> episode_deadline_;
    std::chrono::milliseconds boot_timeout_;
    std::chrono::steady_clock::time_point started_;
    bool restored_ = false;
    std::optional<SnapshotOrigin> origin_;
    bool time_ran_out_ = false;
};

} // namespace agentvm
