#include "guest/agent/drain.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

#include <cerrno>
#include <cmath>

#include "common/error.hpp"

namespace agentvm {
namespace {

void kill_command(const Running& command)
{
    ::kill(-command.pid, SIGKILL);
    command.cgroup.kill_all();
}

} // namespace

std::optional<Clock::time_point> deadline_after(Clock::time_point start, std::optional<double> timeout_s)
{
    if (!timeout_s)
        return std::nullopt;
    return start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(*timeout_s));
}

Drained drain(const Running& command, std::span<Capture, 2> captures, Watch& watch, const Json& id, bool stream,
              Outbox& outbox)
{
    return drain_streaming(command, captures, watch, id, stream ? &outbox : nullptr);
}

Drained drain_quietly(const Running& command, std::span<Capture, 2> captures, Watch& watch)
{
    return drain_streaming(command, captures, watch, nullptr, nullptr);
}

Drained drain_streaming(const Running& command, std::span<Capture, 2> captures, Watch& watch, const Json& id,
                        Outbox* stream_to)
{
    Drained result;
    bool over = false;
    Clock::time_point last_output{};
    const auto finish = [&] {
        if (!over)
            watch.over();
        over = true;
        result.end = last_output = Clock::now();
    };
    // Each descriptor keeps its slot (the captures' first, in order); one not watched gets
    // fd -1, which poll() skips.
    enum { stdout_slot, stderr_slot, watch_slot, pid_slot, cancel_slot, slots };

    // When the timeout next acts: the deadline, then (after an interrupt) the kill; never
    // once it has killed.
    constexpr Clock::time_point never = Clock::time_point::max();
    Clock::time_point next_step = command.deadline.value_or(never);
    for (;;) {
        const Clock::time_point now = Clock::now();
        if (over) {
            const bool open = captures[0].open() || captures[1].open();
            if (!open || now - last_output >= quiet_after_exit || now - result.end >= drain_cap_after_exit)
                break;
        } else if (next_step != never && now >= next_step) {
            if (!result.timed_out && command.interrupt_grace) {
                ::kill(command.pid, SIGINT);
                next_step = now + *command.interrupt_grace;
            } else {
                kill_command(command);
                next_step = never;
            }
            result.timed_out = true;
        }

        pollfd fds[slots] = {
            {captures[0].fd(), POLLIN, 0},
            {captures[1].fd(), POLLIN, 0},
            {over ? -1 : watch.fd(), watch.events(), 0},
            {over ? -1 : command.pidfd, POLLIN, 0},
            {result.cancelled ? -1 : command.cancel_fd, POLLIN, 0},
        };
        int wait_ms = -1;
        if (over)
            wait_ms = static_cast<int>(quiet_after_exit.count());
        else if (next_step != never)
            wait_ms = static_cast<int>(
                std::ceil(std::chrono::duration<double, std::milli>(next_step - now).count()));
        if (::poll(fds, slots, wait_ms) < 0 && errno != EINTR)
            throw_errno("poll");

        for (size_t i = 0; i < captures.size(); ++i)
            if (fds[i].revents != 0 && captures[i].read_some(id, stream_to))
                last_output = Clock::now();
        if (fds[watch_slot].revents != 0 && watch.ready(fds[watch_slot].revents))
            finish();
        if (fds[pid_slot].revents != 0) {
            int wait_status = 0;
            while (::waitpid(command.pid, &wait_status, 0) < 0 && errno == EINTR) {
            }
            result.wait_status = wait_status;
            finish();
        }
        if (fds[cancel_slot].revents != 0) {
            result.cancelled = true;
            if (!over) {
                result.killed_by_cancel = true;
                kill_command(command);
                next_step = never;
            }
        }
    }
    return result;
}

void put_outcome(Json& response, const Drained& drained, std::span<Capture, 2> captures, Clock::time_point start)
{
    if (drained.killed_by_cancel)
        response["cancelled"] = true;
    captures[0].put(response);
    captures[1].put(response);
    response["duration_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(drained.end - start).count();
}

} // namespace agentvm
