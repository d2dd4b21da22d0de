// One client connection: reads request lines, answers file calls in request order on the
// reading thread (so appending write_file chunks land in order), and runs each exec on a
// thread of its own so calls overlap. Output goes through the Outbox, a line at a time.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>

#include "guest/agent/outbox.hpp"
#include "guest/agent/protocol.hpp"
#include "vmm/fd.hpp"

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
    void start_exec(Json id, ExecRequest request);
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
    Json close_id_;
};

} // namespace agentvm
