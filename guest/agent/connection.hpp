// One client connection: reads request lines, answers file calls in request order on the
// reading thread (so appending write_file chunks land in order), and runs each exec on a
// thread of its own so calls overlap. Shell calls also get threads, but take turns in
// request order on the connection's one bash. Output goes through the Outbox, a line at
// a time.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <set>
#include <string>

#include "guest/agent/outbox.hpp"
#include "protocol/agent_protocol.hpp"
#include "guest/agent/shell.hpp"
#include "common/fd.hpp"

namespace agentvm {

class Connection {
public:
    explicit Connection(Fd socket);
    ~Connection();
    Connection(const Connection&) = delete;
    Connection& operator=(const Connection&) = delete;

    // Returns when the peer has closed or sent "close" and every call has finished.
    void serve();

private:
    void handle_line(std::string&& line);
    // Runs `call` on a thread of its own, counted in running_calls_, answering for `id`.
    void start_call(Json id, std::function<Json()> call);
    void start_shell(Json id, ShellRequest request);
    // Marks a shell ticket done (run or failed to start) and moves the turn past every
    // finished ticket.
    void finish_shell_turn(uint64_t ticket);
    // Kills the process groups of running calls: nobody is left to read their answers.
    void cancel();
    void wait_for_calls(bool watch_hangup);

    Fd socket_;
    Fd cancel_; // eventfd, readable once the connection is abandoned
    Outbox outbox_;
    std::mutex mutex_;
    std::condition_variable calls_done_;
    size_t running_calls_ = 0;
    bool close_requested_ = false;
    // Shell calls run in the order they were sent: each takes a ticket, and waits for its
    // turn.
    Shell shell_;
    std::condition_variable shell_turn_changed_;
    uint64_t shell_tickets_ = 0;
    uint64_t shell_turn_ = 0;
    std::set<uint64_t> finished_shell_tickets_;
    Json close_id_;
};

} // namespace agentvm
