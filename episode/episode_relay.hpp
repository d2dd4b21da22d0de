// The host half of `agentvm episode`: JSON lines from the harness (stdin) go to the guest
// agent, the agent's lines come back to the harness (stdout), unchanged. Only lines about a
// call in flight come back: the guest is root in its VM and may speak in its agent's place,
// so a line about an id the relay did not send (or that has answered) is dropped, and one
// about the host's own snapshot call ends the episode. The relay checks
// each request with the agent's own parser first, so a malformed line is answered here and
// the relay always knows which calls are still waiting for their final response: if the
// agent, the guest or the VM goes away, each of them gets an error instead of silence.
// Requests are held whole (they are capped at max_line_bytes); responses are passed on as
// they arrive (ResponseStream), so their size costs the relay no memory.
//
// Two ops are the host's own, answered here. "snapshot", through a handler the episode sets
// (on_snapshot), is taken once every call sent before it has answered, and no request after
// it is read until then; it waits among the other calls, and keeps the episode from
// finishing until it is answered. "env" sets the sandbox's environment, the one place it is
// kept for serve and the Python client alike: merged into every exec request (the request's
// own entries win), and exported into the persistent shell by a shell call of the relay's own
// before the first shell call after it was set, and again after a shell call that answered
// timed_out or cancelled (that killed the shell). The export's answer goes nowhere.
//
// Runs on the VM's event loop thread.
#pragma once

#include <chrono>
#include <deque>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "core/async_writer.hpp"
#include "episode/line_reader.hpp"
#include "episode/response_stream.hpp"
#include "common/fd.hpp"
#include "common/warn_limiter.hpp"
#include "core/loop_timer.hpp"
#include "protocol/agent_protocol.hpp"
#include "protocol/response_line.hpp"

namespace agentvm {

class EpisodeRelay {
public:
    enum class End {
        finished,        // input ended (or a close call) and every call was answered
        agent_lost,      // the agent's connection ended with calls pending
        watchdog,        // a call outlived its own timeout by the grace period
        agent_protocol,  // the agent sent something that is not a protocol line
        output_failed,   // stdout went away
    };
    using Ended = std::function<void(End, const std::string& why)>;
    // Takes a live snapshot named `name` and calls `answer` with the response's fields (a
    // result, or an "error" object), on the loop's thread, exactly once.
    using SnapshotHandler = std::function<void(const std::string& name, std::function<void(Json answer)> answer)>;

    // How long past a call's own timeout the agent gets to answer before the VM is deemed
    // wedged: the agent kills at the timeout and answers within half a second after. Every
    // byte of the call's answer that arrives (a big response takes a while to cross) starts
    // the grace period again: only an agent that stays silent trips the watchdog.
    static constexpr std::chrono::seconds watchdog_grace{10};
    // The timeout of an exec or shell call that names none (episode --call-timeout, run
    // --timeout): without one, a command that never ends would hold its call forever.
    static constexpr double default_call_timeout_s = 600;
    // One stream's max_output in an episode, which bounds every response line.
    static constexpr uint64_t max_output_limit = uint64_t{64} << 20;
    // No honest response line is longer (max_response_line_for, protocol/response_line.hpp).
    // The episode passes lines on as they arrive and ends at a longer one; `agentvm run`
    // holds its one whole.
    static constexpr size_t max_response_line = max_response_line_for(max_output_limit);
    // The most bytes for the harness that wait in the relay before it stops reading the
    // agent (responses wait in the guest then): with a read buffer and a held line, what a
    // response costs the relay at most, however long it is.
    static constexpr size_t max_queued_to_output = size_t{16} << 20;

    // call_timeout_s: added as "timeout" to every exec and shell request without one
    // (nullopt: requests go to the agent unchanged). max_request_bytes: the longest request
    // line, the agent's own bound unless a test sets a lower one to reach it cheaply.
    EpisodeRelay(EventLoop& loop, int in_fd, int out_fd, Ended on_end,
                 std::chrono::milliseconds grace = watchdog_grace,
                 std::optional<double> call_timeout_s = std::nullopt, size_t max_request_bytes = max_line_bytes);
    EpisodeRelay(const EpisodeRelay&) = delete;
    EpisodeRelay& operator=(const EpisodeRelay&) = delete;

    // The agent is reachable: start reading requests. A non-empty `announcement` (a whole
    // line) goes to the output first.
    void start(Fd agent, std::string announcement = {});
    // Entries every exec gets and the shell exports from the start (the egress proxy's, for
    // `agentvm episode --egress-allow`); an env op's own entries win over them. Before start().
    void preset_env(std::map<std::string, std::string> env);
    // The episode takes live snapshots; without a handler the op is refused.
    void on_snapshot(SnapshotHandler handler) { snapshot_handler_ = std::move(handler); }
    // After stop_output(): an error response for every call still waiting, queued for
    // flush_output(). Returns how many there were.
    size_t fail_pending(const std::string& code, const std::string& message);
    // The loop is about to stop: stdout writes only queue from now on (see AsyncWriter), and
    // the relay no longer ends by itself: the agent's connection going away now is a
    // consequence of the VM stopping, not its cause.
    void stop_output()
    {
        stopping_ = true;
        out_.stop();
    }
    // After the loop has stopped: writes everything still queued.
    void flush_output() { out_.flush_blocking(); }

private:
    struct Pending {
        std::string id_json;  // the id as the request spelled it, for error responses
        uint64_t order;       // errors for unanswered calls go out in request order
        std::optional<std::chrono::steady_clock::time_point> deadline;
        bool shell = false;   // one that times out or is cancelled kills the shell, and its env
        // It follows something until cancelled (attach, watch): a snapshot does not wait for it, as
        // it would never be taken (the call, in the guest, is the snapshot's as it runs).
        bool follows = false;
    };

    void on_request(std::string&& line);
    // Whether a request may use `id`; if not, it is answered with the reason.
    bool id_free(const std::string& id);
    void set_env(const std::string& id, const Json& request);
    // Sends the shell call that exports env_, ahead of the shell call about to be sent.
    void export_env();
    void start_snapshot(const std::string& id, const std::string& name);
    void take_next_snapshot();
    void on_response(const ResponseSummary& summary);
    // A line of the agent's about no call in flight: dropped, never passed on; an answer to
    // a call of the host's own ends the episode (the guest forged it).
    void on_stray_line(const ResponseSummary& summary);
    void on_input_end(int err);
    void on_agent_end(int err);
    // Bytes of call `id`'s answer arrived: it gets the grace period again from now.
    void on_progress(const std::string& id);
    void reply_error(const std::string& id_json, const std::string& code, const std::string& message);
    void emit(std::string line);
    void arm_watchdog();
    void on_watchdog();
    void end(End how, const std::string& why);

    EventLoop& loop_;
    Ended on_end_;
    Fd agent_;
    LineReader input_;
    AsyncWriter out_;
    std::optional<ResponseStream> agent_in_;
    std::optional<AsyncWriter> agent_out_;
    LoopTimer watchdog_;
    std::chrono::milliseconds grace_;
    std::optional<double> call_timeout_s_;
    size_t max_request_bytes_;
    std::map<std::string, Pending> pending_;  // by id as compact JSON
    std::map<std::string, Pending> host_pending_;  // the host's own calls (snapshot), as pending_
    std::map<std::string, std::string> env_;  // set by the env op, on top of base_env_
    std::map<std::string, std::string> base_env_;
    bool env_due_ = false;  // the shell lacks env_: export it before the next shell call
    std::set<std::string> exports_;  // ids of the relay's export calls the agent has not answered
    uint64_t exports_made_ = 0;
    SnapshotHandler snapshot_handler_;
    std::deque<std::pair<std::string, std::string>> snapshots_waiting_;  // (id, name), in order
    bool snapshot_running_ = false;
    std::deque<std::string> held_lines_;  // requests read after a snapshot's, until it is taken
    bool agent_done_ = false;  // the agent closed after every call, while a host call was pending
    uint64_t requests_ = 0;
    bool input_done_ = false;  // stdin ended, or a close call was sent
    bool ended_ = false;
    bool stopping_ = false;  // stop_output() ran
    bool agent_paused_ = false;  // not reading the agent until stdout has drained
    uint64_t stray_lines_ = 0;
    WarnLimiter stray_warnings_;
};

} // namespace agentvm
