// Connects to the tool-call agent inside the guest (vsock port 52) once it listens. While the
// guest boots the connection is refused (no driver yet, or no listener: RST), so it is
// retried every few milliseconds until the agent answers or the boot deadline passes.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "common/fd.hpp"
#include "core/loop_timer.hpp"
#include "protocol/vsock_ports.hpp"
#include "vmm/vm.hpp"

namespace agentvm {

class AgentLink {
public:
    using Connected = std::function<void(Fd socket)>;
    using Failed = std::function<void(const std::string& why)>;

    // resume: the VM was restored from a snapshot, so the link first sends the agent the
    // `resume` call (host time, fresh entropy, the VM's guest_pids_max) and hands the socket
    // over once it answered.
    AgentLink(Vm& vm, std::chrono::milliseconds deadline, bool resume, Connected on_connected,
              Failed on_failed);
    AgentLink(const AgentLink&) = delete;
    AgentLink& operator=(const AgentLink&) = delete;

    // Starts trying; call on the loop's thread or before the VM runs.
    void start();
    // Stops trying (the VM is going away). Safe to call at any time.
    void cancel();

private:
    // Reading the one line the link expects at a time (the handshake, the resume answer).
    enum class LineRead { more, line, closed, garbled };
    LineRead read_line(size_t max);
    void attempt();
    void read_handshake();
    void send_resume();
    void read_resume_answer();
    void connected();

    Vm& vm_;
    std::chrono::milliseconds deadline_;
    bool resume_;
    Connected on_connected_;
    Failed on_failed_;
    LoopTimer retry_;
    LoopTimer give_up_;
    Fd socket_;
    std::string line_;
    unsigned attempts_ = 0;
    bool done_ = false;
};

} // namespace agentvm
