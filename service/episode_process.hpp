// One `agentvm episode` child process: the VM of one sandbox (docs/protocol.md, "The host
// side"). serve writes request lines to its stdin and reads its lines from stdout; agentvm's
// own messages on its stderr are kept (the last 16 KiB) for the error a failed sandbox
// reports. The child is started with --announce-ready, dies with serve (PR_SET_PDEATHSIG),
// and its exit is seen on the loop through a pidfd.
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/fd.hpp"
#include "core/async_writer.hpp"
#include "core/event_loop.hpp"
#include "core/fd_reader.hpp"
#include "protocol/agent_protocol.hpp"
#include "protocol/line_framer.hpp"
#include "protocol/response_line.hpp"

namespace agentvm {

class EpisodeProcess {
public:
    struct Handlers {
        std::function<void(bool restored)> on_ready;     // the announcement arrived
        std::function<void(std::string&& line)> on_line;  // every later line, without '\n'
        // A line serve cannot take: the child is killed, on_exit follows; no more lines.
        std::function<void(const std::string& why)> on_broken;
        std::function<void(int wait_status)> on_exit;     // reaped; the object may be destroyed then
    };

    // The largest max_output serve lets a call ask for (Sandbox::call lowers a larger one to
    // it): the agent's default, 16 MiB per stream. Below the episode's own 64 MiB because
    // serve, unlike the episode, holds each line whole (and then its JSON) in memory.
    static constexpr uint64_t max_output_limit = default_max_output;
    // The longest line taken from the episode, 200 MiB: the longest an honest agent sends
    // under max_output_limit (max_response_line_for). A longer one is on_broken.
    static constexpr size_t max_line = max_response_line_for(max_output_limit);

    // Starts `program episode --announce-ready ARGS...`. Throws Error when it cannot.
    EpisodeProcess(EventLoop& loop, const std::string& program, const std::vector<std::string>& args,
                   Handlers handlers);
    // Kills the child (SIGKILL) if it still runs, and reaps it.
    ~EpisodeProcess();
    EpisodeProcess(const EpisodeProcess&) = delete;
    EpisodeProcess& operator=(const EpisodeProcess&) = delete;

    void send(std::string line);  // one request, with its '\n'
    size_t queued_bytes() const { return stdin_ ? stdin_->queued_bytes() : 0; }
    // End of the episode's stdin: it answers what runs, then ends (exit 0).
    void close_input();
    // SIGTERM: the episode fails its running calls with `stopped`, stops the VM and exits.
    void terminate();
    void kill();
    // Backpressure: no line is read from the episode until resume_output() (the episode
    // then stops reading its guest, which waits).
    void pause_output() { stdout_reader_->pause(); }
    void resume_output() { stdout_reader_->resume(); }

    pid_t pid() const { return pid_; }
    bool running() const { return !exited_; }
    const std::string& stderr_tail() const { return stderr_tail_; }

private:
    void on_stdout_line(std::string&& line);
    void broken(const std::string& why);
    void keep_stderr(std::string_view bytes);
    void on_pidfd();

    EventLoop& loop_;
    Handlers handlers_;
    pid_t pid_ = -1;
    Fd pidfd_;
    Fd stdin_fd_;
    Fd stdout_fd_;
    Fd stderr_fd_;
    std::optional<AsyncWriter> stdin_;
    LineFramer stdout_lines_;
    std::optional<FdReader> stdout_reader_;
    std::optional<FdReader> stderr_reader_;
    std::string stderr_tail_;
    bool ready_ = false;
    bool broken_ = false;
    bool exited_ = false;
};

} // namespace agentvm
