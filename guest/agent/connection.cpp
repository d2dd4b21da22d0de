#include "guest/agent/connection.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "guest/agent/attach.hpp"
#include "guest/agent/exec.hpp"
#include "guest/agent/file_info.hpp"
#include "guest/agent/file_ops.hpp"
#include "guest/agent/files.hpp"
#include "protocol/line_framer.hpp"
#include "guest/agent/resume.hpp"
#include "guest/agent/spawn_process.hpp"
#include "common/error.hpp"

namespace agentvm {

namespace {

bool is_blank(const std::string& line)
{
    return line.find_first_not_of(" \t\r") == std::string::npos;
}

void signal_cancel(int eventfd)
{
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(eventfd, &one, sizeof(one));
}

bool is_signalled(int eventfd)
{
    pollfd pfd{eventfd, POLLIN, 0};
    return ::poll(&pfd, 1, 0) > 0;
}

} // namespace

Connection::Connection(Fd socket, Sessions& sessions)
    : socket_(std::move(socket)), outbox_(socket_.get(), [this] { cancel(); }), sessions_(sessions)
{
}

Connection::~Connection()
{
    outbox_.flush_and_stop();
}

void Connection::cancel()
{
    std::lock_guard lock(cancels_mutex_);
    abandoned_ = true;
    for (const auto& [id, fd] : call_cancels_)
        signal_cancel(fd.get());
}

bool Connection::cancel_call(const Json& id)
{
    std::lock_guard lock(cancels_mutex_);
    const auto [first, last] = call_cancels_.equal_range(id.dump());
    for (auto it = first; it != last; ++it)
        signal_cancel(it->second.get());
    return first != last;
}

void Connection::serve()
{
    LineFramer framer(
        max_line_bytes, [this](std::string&& line) { handle_line(std::move(line)); },
        [this] {
            outbox_.send(to_line(error_response(nullptr, "line_too_long",
                "request lines are limited to " + std::to_string(max_line_bytes) + " bytes")));
        });

    std::string buffer(256 * 1024, '\0');
    bool hung_up = false;
    for (;;) {
        {
            std::lock_guard lock(mutex_);
            if (close_requested_)
                break;
        }
        const ssize_t n = ::recv(socket_.get(), buffer.data(), buffer.size(), 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            hung_up = n < 0;
            framer.finish();
            break;
        }
        framer.feed({buffer.data(), static_cast<size_t>(n)});
    }

    requests_ended_.signal();
    if (hung_up)
        cancel();
    wait_for_calls(!hung_up);
    std::lock_guard lock(mutex_);
    if (close_requested_)
        outbox_.send(to_line(Json{{"id", close_id_}, {"ok", true}}));
}

void Connection::wait_for_calls(bool watch_hangup)
{
    std::unique_lock lock(mutex_);
    while (running_calls_ > 0) {
        if (calls_done_.wait_for(lock, std::chrono::milliseconds(100), [&] { return running_calls_ == 0; }))
            break;
        if (!watch_hangup)
            continue;
        // A peer that only shut down its sending side still wants the answers; one that
        // closed the socket altogether (POLLHUP) does not, so its calls are cancelled.
        pollfd pfd{socket_.get(), 0, 0};
        if (::poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLHUP | POLLERR))) {
            cancel();
            watch_hangup = false;
        }
    }
}

void Connection::handle_line(std::string&& line)
{
    {
        std::lock_guard lock(mutex_);
        if (close_requested_)
            return; // lines pipelined after "close" are not served
    }
    if (is_blank(line))
        return;
    Request request;
    try {
        request = parse_request(line);
    } catch (const RequestError& e) {
        outbox_.send(to_line(error_response(e.id, e.error.code(), e.error.what())));
        return;
    }
    std::string().swap(line); // a write_file line can be 64 MiB: do not hold it twice

    try {
        const Json& id = request.id;
        if (auto* exec = std::get_if<ExecRequest>(&request.op)) {
            start_call(id, [this, id, exec = std::move(*exec)](int cancel_fd) {
                return run_exec(id, exec, outbox_, cancel_fd, sessions_.processes);
            });
        } else if (auto* shell = std::get_if<ShellRequest>(&request.op)) {
            start_turn(
                sessions_.shell_turns, id,
                [this, id, shell = std::move(*shell)](int cancel_fd) { return sessions_.shell.run(id, shell, outbox_, cancel_fd); },
                [id] { return Shell::not_run(id); });
        } else if (auto* run = std::get_if<RunCodeRequest>(&request.op)) {
            Contexts::Cell cell = sessions_.contexts.cell_for(*run);
            start_turn(
                cell.turns(), id,
                [id, cell, run = std::move(*run), this](int cancel_fd) mutable {
                    return cell.run(id, run, outbox_, cancel_fd);
                },
                [id, cell] { return cell.not_run(id); });
        } else if (std::optional<Json> answer = sessions_.contexts.answer(id, request.op)) {
            outbox_.send(to_line(*answer));
        } else if (auto* write = std::get_if<WriteFileRequest>(&request.op)) {
            const size_t bytes = write_file(*write);
            outbox_.send(to_line(Json{{"id", id}, {"ok", true}, {"bytes", bytes}}));
        } else if (auto* read = std::get_if<ReadFileRequest>(&request.op)) {
            outbox_.send(to_line(read_file(id, *read, outbox_)));
        } else if (auto* stat = std::get_if<StatRequest>(&request.op)) {
            outbox_.send(to_line(stat_path(id, *stat)));
        } else if (auto* list = std::get_if<ListDirRequest>(&request.op)) {
            outbox_.send(to_line(list_dir(id, *list)));
        } else if (auto* make = std::get_if<MakeDirRequest>(&request.op)) {
            outbox_.send(to_line(make_dir(id, *make)));
        } else if (auto* move = std::get_if<MoveRequest>(&request.op)) {
            outbox_.send(to_line(move_path(id, *move)));
        } else if (auto* remove = std::get_if<RemoveRequest>(&request.op)) {
            outbox_.send(to_line(remove_path(id, *remove)));
        } else if (auto* watch = std::get_if<WatchRequest>(&request.op)) {
            start_call(id, [this, id, watch = std::move(*watch)](int cancel_fd) {
                return run_watch(id, watch, outbox_, cancel_fd, requests_ended_.fd());
            });
        } else if (auto* spawn = std::get_if<SpawnRequest>(&request.op)) {
            outbox_.send(to_line(spawn_process(id, *spawn, sessions_.processes)));
        } else if (auto* attach = std::get_if<AttachRequest>(&request.op)) {
            start_call(id, [this, id, attach = std::move(*attach)](int cancel_fd) {
                return attach_process(id, attach, sessions_.processes, outbox_, cancel_fd);
            });
        } else if (std::holds_alternative<ListProcessesRequest>(request.op)) {
            outbox_.send(to_line(Json{{"id", id}, {"ok", true}, {"processes", sessions_.list_processes()}}));
        } else if (auto* send = std::get_if<SendStdinRequest>(&request.op)) {
            sessions_.processes.find(send->process)->send_stdin(send->data);
            outbox_.send(to_line(Json{{"id", id}, {"ok", true}, {"bytes", send->data.size()}}));
        } else if (auto* close_stdin = std::get_if<CloseStdinRequest>(&request.op)) {
            sessions_.processes.find(close_stdin->process)->close_stdin();
            outbox_.send(to_line(Json{{"id", id}, {"ok", true}}));
        } else if (auto* signal = std::get_if<SignalRequest>(&request.op)) {
            sessions_.signal(*signal);
            outbox_.send(to_line(Json{{"id", id}, {"ok", true}}));
        } else if (auto* resize = std::get_if<ResizeRequest>(&request.op)) {
            sessions_.processes.find(resize->process)->resize(resize->size);
            outbox_.send(to_line(Json{{"id", id}, {"ok", true}}));
        } else if (auto* cancel = std::get_if<CancelRequest>(&request.op)) {
            const bool running = cancel_call(cancel->call);
            outbox_.send(to_line(Json{{"id", id}, {"ok", true}, {"running", running}}));
        } else if (auto* resume = std::get_if<ResumeRequest>(&request.op)) {
            resume_guest(*resume);
            outbox_.send(to_line(Json{{"id", id}, {"ok", true}}));
        } else if (std::holds_alternative<SnapshotRequest>(request.op)) {
            throw CallError("unknown_op", "op \"snapshot\" is the host's: agentvm episode takes it, not the guest");
        } else {
            std::lock_guard lock(mutex_);
            close_requested_ = true;
            close_id_ = id;
        }
    } catch (const CallError& e) {
        outbox_.send(to_line(error_response(request.id, e.code(), e.what())));
    } catch (const std::exception& e) {
        outbox_.send(to_line(error_response(request.id, "internal", e.what())));
    }
}

void Connection::start_turn(Turns& turns, Json id, std::function<Json(int cancel_fd)> run,
                            std::function<Json()> not_run)
{
    const uint64_t ticket = turns.take_ticket();
    try {
        start_call(std::move(id), [&turns, ticket, run = std::move(run), not_run = std::move(not_run)](int cancel_fd) {
            turns.wait_for(ticket);
            // Pass the turn on however this call ends.
            struct NextTurn {
                Turns& turns;
                uint64_t ticket;
                ~NextTurn() { turns.finish(ticket); }
            } next_turn{turns, ticket};
            return is_signalled(cancel_fd) ? not_run() : run(cancel_fd);
        });
    } catch (const CallError&) {
        turns.finish(ticket); // this call will not run: let the next one
        throw;
    }
}

void Connection::start_call(Json id, std::function<Json(int cancel_fd)> call)
{
    Fd cancel_fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!cancel_fd)
        throw CallError("spawn_failed", std::string("eventfd: ") + std::strerror(errno));
    CallCancels::iterator registered;
    {
        std::lock_guard lock(cancels_mutex_);
        if (abandoned_)
            signal_cancel(cancel_fd.get());
        registered = call_cancels_.emplace(id.dump(), std::move(cancel_fd));
    }
    {
        std::lock_guard lock(mutex_);
        ++running_calls_;
    }
    auto run = [this, id = std::move(id), call = std::move(call), registered] {
        Json response;
        try {
            response = call(registered->second.get());
        } catch (const CallError& e) {
            response = error_response(id, e.code(), e.what());
        } catch (const std::exception& e) {
            response = error_response(id, "internal", e.what());
        }
        // Unregistered before it answers: a cancel that comes after the answer finds nothing.
        {
            std::lock_guard lock(cancels_mutex_);
            call_cancels_.erase(registered);
        }
        outbox_.send_message(std::move(response));
        // Last touch of *this: serve() may return and destroy the connection as soon as
        // the count reaches zero and the lock is released.
        std::lock_guard lock(mutex_);
        --running_calls_;
        calls_done_.notify_all();
    };
    try {
        std::thread(std::move(run)).detach();
    } catch (const std::system_error& e) {
        {
            std::lock_guard lock(cancels_mutex_);
            call_cancels_.erase(registered);
        }
        std::lock_guard lock(mutex_);
        --running_calls_;
        throw CallError("spawn_failed", std::string("thread: ") + e.what());
    }
}

} // namespace agentvm
