// The wait at the heart of exec and shell calls: while the command runs, collect its stdout
// and stderr, and kill its process group and cgroup when the call's timeout passes or the
// connection cancels the call; once the command is over, go on collecting until its pipes close or
// fall quiet.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <span>

#include "guest/agent/call_cgroup.hpp"
#include "guest/agent/capture.hpp"
#include "guest/agent/outbox.hpp"
#include "protocol/agent_protocol.hpp"

namespace agentvm {

using Clock = std::chrono::steady_clock;

// Once a call's command has finished, output still in flight is read until its pipes
// close, but a background process that keeps them open must not hold the call: reading
// stops once they stay quiet this long, or after the cap whatever they do.
constexpr std::chrono::milliseconds quiet_after_exit{50};
constexpr std::chrono::milliseconds drain_cap_after_exit{500};

// `timeout_s` seconds after `start`; none when the call has no timeout.
std::optional<Clock::time_point> deadline_after(Clock::time_point start, std::optional<double> timeout_s);

// The one descriptor, beside the output pipes, that a call watches while its command runs:
// exec's stdin pipe, shell's status FIFO.
class Watch {
public:
    // Negative: nothing to watch at the moment.
    virtual int fd() const = 0;
    virtual short events() const = 0;
    // poll() reported fd(). Returns whether this means the command is over.
    virtual bool ready(short revents) = 0;
    // The command is over; fd() is not watched any more.
    virtual void over() {}

protected:
    ~Watch() = default;
};

struct Running {
    pid_t pid;  // leader of the process group that a timeout or a cancel kills
    const CallCgroup& cgroup;  // killed with it, for what left the process group
    int pidfd;  // readable once the leader exits, which ends the command
    int cancel_fd;
    std::optional<Clock::time_point> deadline;
    // Set: at the deadline the leader only gets SIGINT, and the kill comes this much later if
    // the command is not over by then (an interpreter's cell gets KeyboardInterrupt first).
    std::optional<Clock::duration> interrupt_grace = std::nullopt;
};

struct Drained {
    std::optional<int> wait_status; // the leader's, when it exited (it is reaped)
    bool timed_out = false;
    bool cancelled = false; // also when the cancel came after the command was over
    bool killed_by_cancel = false; // the cancel came while the command ran, and killed it
    Clock::time_point end{}; // when the command was over
};

// Returns once the command is over and its output drained; `captures` then hold what was
// kept. Streams events through `outbox` when `stream` is set.
Drained drain(const Running& command, std::span<Capture, 2> captures, Watch& watch, const Json& id, bool stream,
              Outbox& outbox);
// The same, streaming as events for `id` through `stream_to` when given.
Drained drain_streaming(const Running& command, std::span<Capture, 2> captures, Watch& watch, const Json& id,
                        Outbox* stream_to);
// The same for a command whose output only its captures see (a spawned process's).
Drained drain_quietly(const Running& command, std::span<Capture, 2> captures, Watch& watch);

// The end every command call's response shares: "cancelled" when a cancel killed the command,
// each stream's output and _truncated flag, and duration_ms from `start` to its end.
void put_outcome(Json& response, const Drained& drained, std::span<Capture, 2> captures, Clock::time_point start);

} // namespace agentvm
