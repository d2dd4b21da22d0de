// A command the agent keeps in its process table (process_table.hpp) while it runs and for a
// while after: an exec call's command, or a spawned one. What it is (pid, tag, argv, env, cwd,
// start), what it has written (an OutputRing), how it ended, and the ways in: attachments
// that follow its output, its stdin, signals, its pty's size. Shared between the thread that
// drains it and the connections that reach it by pid or tag.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "guest/agent/process_output.hpp"
#include "guest/agent/process_stdin.hpp"
#include "protocol/agent_protocol.hpp"
#include "common/fd.hpp"

namespace agentvm {

enum class ProcessKind { exec, spawn };

struct ProcessEnd {
    std::optional<int> exit_code;  // 0-255, when it exited
    std::optional<int> signal;     // when a signal killed it
    bool timed_out = false;
    bool oom_killed = false;
    int64_t duration_ms = 0;
};

class Process {
public:
    // Attachments to one process at once.
    static constexpr size_t max_attachments = 16;

    Process(ProcessKind kind, const ExecRequest& command, uint64_t replay_bytes);

    // Once it runs: its pid, a pidfd to signal it by (a pid could be another's once it is
    // reaped), its stdin when it has one that send_stdin feeds, its pty's master when it has one.
    void started(pid_t pid, Fd pidfd, std::shared_ptr<ProcessStdin> stdin_feed, Fd pty_master);
    // It has exited and its output is drained: wakes every attachment.
    void finish(const ProcessEnd& end);

    ProcessKind kind() const { return kind_; }
    pid_t pid() const;  // 0 until started
    const std::optional<std::string>& tag() const { return tag_; }
    bool running() const;
    std::chrono::steady_clock::time_point ended_at() const;
    // Its entry in list_processes.
    Json describe() const;

    // From the thread that drains it.
    void append_output(const char* stream, std::string_view data);

    // Attachments. attach() throws CallError(limit) past max_attachments.
    void attach();
    void detach();
    struct Update {
        uint64_t lost = 0;  // bytes dropped from what is kept before the reader got them
        std::vector<OutputChunk> chunks;
        std::optional<ProcessEnd> end;  // set once the output is all read and it has ended
    };
    // Offset of the oldest byte kept, and of the next one to come.
    uint64_t output_start() const;
    uint64_t output_end() const;
    // What came after `cursor` (advanced past it), waiting up to `wait` for something to.
    Update next(uint64_t& cursor, size_t max_bytes, std::chrono::milliseconds wait);

    // Throw CallError: not_found (it has ended), stdin_closed, limit, bad_field.
    void send_stdin(std::string_view data);
    void close_stdin();
    void signal(int signal, bool group);
    void resize(const PtySize& size);
    // As the agent exits: SIGKILL to its process group, whatever state it is in.
    void kill_group() const;

private:
    void require_running() const;  // with mutex_ held

    const ProcessKind kind_;
    const std::optional<std::string> tag_;
    const std::vector<std::string> argv_;
    const std::map<std::string, std::string> env_;
    const std::optional<std::string> cwd_;
    const double started_at_;  // seconds since the epoch
    const std::chrono::steady_clock::time_point start_;

    mutable std::mutex mutex_;
    std::condition_variable changed_;
    pid_t pid_ = 0;
    Fd pidfd_;
    std::shared_ptr<ProcessStdin> stdin_;
    Fd pty_master_;
    OutputRing output_;
    std::optional<ProcessEnd> end_;
    std::chrono::steady_clock::time_point ended_at_{};
    size_t attachments_ = 0;
};

} // namespace agentvm
