// One client connection: reads request lines, answers file calls and cancels in request
// order on the reading thread (so appending write_file chunks land in order), and runs each
// exec on a thread of its own so calls overlap. Shell and run_code calls also get threads,
// but take turns in request order on the agent's one bash and on each of its interpreter
// contexts (Sessions), which outlive the connection. Output goes through the Outbox, a line
// at a time.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "guest/agent/file_watch.hpp"
#include "guest/agent/outbox.hpp"
#include "guest/agent/sessions.hpp"
#include "guest/agent/turns.hpp"
#include "protocol/agent_protocol.hpp"
#include "common/fd.hpp"

namespace agentvm {

class Connection {
public:
    // sessions: the agent's, shared by every connection and outliving each.
    Connection(Fd socket, Sessions& sessions);
    ~Connection();
    Connection(const Connection&) = delete;
    Connection& operator=(const Connection&) = delete;

    // Returns when the peer has closed or sent "close" and every call has finished.
    void serve();

private:
    // A running call's cancel: an eventfd its thread watches, readable once the call is
    // cancelled (by a cancel request, or the whole connection by cancel()).
    using CallCancels = std::multimap<std::string, Fd>;

    void handle_line(std::string&& line);
    // Runs `call` on a thread of its own, counted in running_calls_, answering for `id`;
    // `call` gets its cancel eventfd.
    void start_call(Json id, std::function<Json(int cancel_fd)> call);
    // A call that waits for its turn in `turns` and is answered by `not_run` instead of
    // running when it was cancelled before its turn came.
    void start_turn(Turns& turns, Json id, std::function<Json(int cancel_fd)> run,
                    std::function<Json()> not_run);
    // Kills the call(s) with this id; false when none runs.
    bool cancel_call(const Json& id);
    // Kills the process groups of running calls: nobody is left to read their answers.
    void cancel();
    void wait_for_calls(bool watch_hangup);

    Fd socket_;
    Outbox outbox_;
    std::mutex mutex_;
    std::condition_variable calls_done_;
    size_t running_calls_ = 0;
    bool close_requested_ = false;
    Json close_id_;
    // Not under mutex_: cancel() also runs on the outbox's writer thread.
    std::mutex cancels_mutex_;
    CallCancels call_cancels_;
    bool abandoned_ = false;  // cancel() ran: every call, also one starting now, is cancelled
    Sessions& sessions_;
    // Signalled when the peer sends no more requests: its watches end then.
    EndOfRequests requests_ended_;
};

} // namespace agentvm
