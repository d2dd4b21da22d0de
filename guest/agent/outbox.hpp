// The sending half of a connection: calls queue whole lines and a writer thread sends
// them, so lines of concurrent calls never interleave and a peer that reads slowly holds
// up only the writer, never a running command (its output keeps draining into memory that
// max_output already bounds).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <variant>

#include "protocol/agent_protocol.hpp"

namespace agentvm {

class Outbox {
public:
    // `socket` stays owned by the caller and must outlive the Outbox. on_broken runs once,
    // on the writer thread, when the peer stops accepting data.
    Outbox(int socket, std::function<void()> on_broken);
    ~Outbox();
    Outbox(const Outbox&) = delete;
    Outbox& operator=(const Outbox&) = delete;

    // Never blocks; dropped once the peer is gone.
    void send(std::string line);
    // Queues a message that the writer encodes as it sends it (write_line), a piece at a
    // time: the line of a response carrying megabytes of escaped output never exists whole
    // in memory, and its first bytes leave at once. Never blocks; counts as nothing toward
    // send_paced's limit (a call's response is bounded by its max_output).
    void send_message(Json message);
    // Blocks while more than `limit` bytes wait: for producers that can wait, such as
    // read_file, whose output is not otherwise bounded.
    void send_paced(std::string line, size_t limit);
    // Sends everything queued, then stops the writer.
    void flush_and_stop();

private:
    // False once the peer takes no more.
    bool send_all(std::string_view bytes);
    void write_loop();

    int socket_;
    std::function<void()> on_broken_;
    std::mutex mutex_;
    std::condition_variable changed_;
    std::deque<std::variant<std::string, Json>> queue_;
    size_t queued_bytes_ = 0;
    bool stopping_ = false;
    bool broken_ = false;
    std::thread writer_;
};

} // namespace agentvm
