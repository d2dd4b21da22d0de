// One sandbox of agentvm serve: one `agentvm episode` process (one VM), the calls running in
// it, and the bounded history of the calls it has answered (docs/api.md, "Sandboxes").
//
// Calls are agent-protocol requests (docs/protocol.md) without an id: the sandbox numbers
// them, sends them to its episode and hands each line that comes back about a call to that
// call's handlers, without its id. Its env goes to the episode once, when it is assigned (the
// relay's env op: merged into every exec, exported in the shell).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "protocol/agent_protocol.hpp"

#include "common/warn_limiter.hpp"
#include "core/loop_timer.hpp"
#include "core/event_loop.hpp"
#include "service/call_history.hpp"
#include "service/episode_process.hpp"
#include "service/sandbox_settings.hpp"

namespace agentvm {

struct CallHandlers {
    std::function<void(Json&& event)> on_event;    // a stream or data event
    std::function<void(Json&& answer)> on_answer;  // the response, or {"error":{code,message}}
};

class Sandbox {
public:
    using Clock = std::chrono::steady_clock;

    struct Hooks {
        std::function<void(Sandbox&, bool restored)> on_ready;
        // The episode ended (after its calls were answered); the sandbox may be destroyed then.
        std::function<void(Sandbox&, const std::string& why)> on_exit;
        // Every call of the sandbox's user answered (serve's own are not), whichever facade
        // or job made it, with the time it took: what metrics count, once per call.
        std::function<void(const Json& answer, std::chrono::duration<double> took)> on_call_answered;
    };

    Sandbox(EventLoop& loop, std::string pool, const std::string& program, const std::vector<std::string>& args,
            size_t history_limit, Hooks hooks);
    ~Sandbox();
    Sandbox(const Sandbox&) = delete;
    Sandbox& operator=(const Sandbox&) = delete;

    // Handing a ready VM to a user: its id, limits, env and metadata.
    using Settings = SandboxSettings;
    void assign(Settings settings);
    // New egress rules for a running sandbox (E2B's updateNetwork), and the env entries they
    // bring (the proxy's), sent to the episode as at assign.
    void change_egress(std::optional<EgressRules> egress, const std::map<std::string, std::string>& env_added);
    bool assigned() const { return !settings_.id.empty(); }
    // The Unix socket of the VMM's end of vsock (`agentvm episode --vsock-uds`), through which
    // serve reaches the guest's ports (service/ports/); empty when the VM has none.
    const std::string& guest_socket() const { return guest_socket_; }
    void set_guest_socket(std::string path) { guest_socket_ = std::move(path); }
    const Settings& settings() const { return settings_; }

    // Starts a call; `summary` is what its history entry records of the request (none: the
    // call is part of one the caller records itself). Returns the call's number, for forget().
    uint64_t call(Json request, std::optional<Json> summary, CallHandlers handlers);
    // A file being uploaded: a second upload to the same path, whose chunks would interleave
    // with the first's, is refused while it runs (false).
    bool claim_upload(const std::string& path) { return uploads_.insert(path).second; }
    void release_upload(const std::string& path) { uploads_.erase(path); }
    // A history entry for a call made of several (a file upload in chunks).
    uint64_t record(Json summary) { return history_.begin(std::move(summary)); }
    void record_end(uint64_t seq, const Json& answer) { history_.end(seq, answer); }
    // The caller went away: the call runs on in the guest and is still recorded, unanswered.
    void forget(uint64_t call);
    // The history entry of a running call, if it has one.
    std::optional<uint64_t> history_seq_of(uint64_t call) const;
    // Cancels the running call recorded as history entry `seq` (the agent's cancel);
    // `on_answer` gets the agent's answer. False when no call of that entry is running.
    bool cancel(uint64_t seq, std::function<void(Json&& answer)> on_answer);

    // Ends the episode (SIGTERM): running calls answer `stopped`, then on_exit.
    void stop(std::string why);
    // An episode that has not ended stop_patience after stop() is killed (SIGKILL).
    static constexpr std::chrono::seconds stop_patience{10};
    void kill_if_overdue(Clock::time_point now);
    // Backpressure from slow HTTP readers: while any hold is on, the episode's lines wait.
    void hold_output();
    void release_output();

    void set_timeout(std::chrono::seconds timeout);
    // Why the sandbox should end now (lifetime or idle time over), if it should.
    std::optional<std::string> expired(Clock::time_point now) const;

    const std::string& id() const { return settings_.id; }
    const std::string& pool() const { return pool_; }
    bool ready() const { return ready_; }
    bool restored() const { return restored_; }
    pid_t pid() const { return episode_->pid(); }
    bool stopping() const { return !stop_reason_.empty(); }
    size_t running_calls() const { return calls_.size(); }
    Clock::time_point started() const { return started_; }
    const CallHistory& history() const { return history_; }
    const std::string& stderr_tail() const { return episode_->stderr_tail(); }
    // What the facades show of a sandbox (docs/api.md, "Sandboxes"), in serve's terms.
    struct Status {
        bool stopping;
        bool warm;  // handed out from a warm pool, not started for its create
        bool restored;
        pid_t pid;
        std::chrono::milliseconds create_time;
        std::chrono::system_clock::time_point created_at;
        std::chrono::system_clock::time_point expires_at;
        size_t calls_running;  // the user's calls, not serve's own
        uint64_t calls;        // every call recorded, running or answered
    };
    Status status() const;

private:
    struct Call {
        CallHandlers handlers;
        std::optional<uint64_t> history_seq;  // none: not recorded
        bool counts_as_activity = true;       // shown as running (not serve's own, not a cancel)
        bool users = true;                    // made for the user (metrics count it), not by serve
        Clock::time_point sent{};
    };
    // The call has its answer: recorded, counted, then handed to its handler.
    void answered(Call& call, Json& answer);
    // The env op: settings_.env to the episode, for every exec and the shell.
    void send_env();
    void on_line(std::string&& line);
    void on_exit(int wait_status);
    uint64_t send(Json request, Call call);
    // Answers every call still held with vm_died: the episode has ended and cannot.
    void fail_calls();

    EventLoop& loop_;
    std::string pool_;
    std::string guest_socket_;
    Hooks hooks_;
    Settings settings_;
    std::unique_ptr<EpisodeProcess> episode_;
    std::map<uint64_t, Call> calls_;
    std::set<std::string> uploads_;
    uint64_t next_call_ = 1;
    CallHistory history_;
    bool ready_ = false;
    bool restored_ = false;
    int output_holds_ = 0;
    std::string stop_reason_;
    Clock::time_point stop_requested_{};
    std::string broken_reason_;
    std::string ended_why_;  // set once the episode has ended
    // Made for a call sent after the episode ended, to answer it on the loop's next turn
    // (never from within call()).
    std::optional<LoopTimer> late_calls_;
    // The episode's lines about no running call: the guest's to send at will, so their
    // warnings are rate-limited.
    WarnLimiter stray_lines_;
    Clock::time_point started_ = Clock::now();
    Clock::time_point assigned_at_{};
    std::chrono::system_clock::time_point assigned_wall_{};
    Clock::time_point deadline_{};
    Clock::time_point last_activity_{};
};

} // namespace agentvm
