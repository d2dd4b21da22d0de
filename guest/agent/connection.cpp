#include "guest/agent/connection.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "guest/agent/exec.hpp"
#include "guest/agent/files.hpp"
#include "protocol/line_framer.hpp"
#include "guest/agent/resume.hpp"
#include "common/error.hpp"

namespace agentvm {

namespace {

bool is_blank(const std::string& line)
{
    return line.find_first_not_of(" \t\r") == std::string::npos;
}

} // namespace

Connection::Connection(Fd socket)
    : socket_(std::move(socket)),
      cancel_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      outbox_(socket_.get(), [this] { cancel(); })
{
    if (!cancel_)
        throw_errno("eventfd");
}

Connection::~Connection()
{
    outbox_.flush_and_stop();
}

void Connection::cancel()
{
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(cancel_.get(), &one, sizeof(one));
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
        if (auto* exec = std::get_if<ExecRequest>(&request.op)) {
            start_call(request.id, [this, id = request.id, exec = std::move(*exec)] {
                return run_exec(id, exec, outbox_, cancel_.get());
            });
        } else if (auto* shell = std::get_if<ShellRequest>(&request.op)) {
            start_shell(std::move(request.id), std::move(*shell));
        } else if (auto* write = std::get_if<WriteFileRequest>(&request.op)) {
            const size_t bytes = write_file(*write);
            outbox_.send(to_line(Json{{"id", request.id}, {"ok", true}, {"bytes", bytes}}));
        } else if (auto* read = std::get_if<ReadFileRequest>(&request.op)) {
            outbox_.send(to_line(read_file(request.id, *read, outbox_)));
        } else if (auto* resume = std::get_if<ResumeRequest>(&request.op)) {
            resume_guest(*resume);
            outbox_.send(to_line(Json{{"id", request.id}, {"ok", true}}));
        } else {
            std::lock_guard lock(mutex_);
            close_requested_ = true;
            close_id_ = request.id;
        }
    } catch (const CallError& e) {
        outbox_.send(to_line(error_response(request.id, e.code(), e.what())));
    } catch (const std::exception& e) {
        outbox_.send(to_line(error_response(request.id, "internal", e.what())));
    }
}

void Connection::start_shell(Json id, ShellRequest request)
{
    uint64_t ticket;
    {
        std::lock_guard lock(mutex_);
        ticket = shell_tickets_++;
    }
    try {
        start_call(id, [this, id, ticket, request = std::move(request)] {
            std::unique_lock lock(mutex_);
            shell_turn_changed_.wait(lock, [&] { return shell_turn_ == ticket; });
            lock.unlock();
            // Pass the turn on however this call ends.
            struct NextTurn {
                Connection& connection;
                uint64_t ticket;
                ~NextTurn() { connection.finish_shell_turn(ticket); }
            } next_turn{*this, ticket};
            return shell_.run(id, request, outbox_, cancel_.get());
        });
    } catch (const CallError&) {
        finish_shell_turn(ticket); // this call will not run: let the next one
        throw;
    }
}

void Connection::finish_shell_turn(uint64_t ticket)
{
    std::lock_guard lock(mutex_);
    finished_shell_tickets_.insert(ticket);
    while (finished_shell_tickets_.erase(shell_turn_))
        ++shell_turn_;
    shell_turn_changed_.notify_all();
}

void Connection::start_call(Json id, std::function<Json()> call)
{
    {
        std::lock_guard lock(mutex_);
        ++running_calls_;
    }
    auto run = [this, id = std::move(id), call = std::move(call)] {
        Json response;
        try {
            response = call();
        } catch (const CallError& e) {
            response = error_response(id, e.code(), e.what());
        } catch (const std::exception& e) {
            response = error_response(id, "internal", e.what());
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
        std::lock_guard lock(mutex_);
        --running_calls_;
        throw CallError("spawn_failed", std::string("thread: ") + e.what());
    }
}

} // namespace agentvm
