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
#include <thread>

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
    // Blocks while more than `limit` bytes wait: for producers that can wait, such as
    // read_file, whose output is not otherwise bounded.
    void send_paced(std::string line, size_t limit);
    // Sends everything queued, then stops the writer.
    void flush_and_stop();

private:
    void write_loop();

    int socket_;
    std::function<void()> on_broken_;
    std::mutex mutex_;
    std::condition_variable changed_;
    std::deque<std::string> queue_;
    size_t queued_bytes_ = 0;
    bool stopping_ = false;
    bool broken_ = false;
    std::thread writer_;
};

} // namespace agentvm
