// Two sockets joined both ways, bytes unchanged: an upgraded client connection (a WebSocket,
// `agentvm port-forward`'s raw TCP) and its stream to the guest's port. Each direction holds at
// most `buffer_bytes` read and not yet written, and reads no more while it is full, so a slow
// reader on either side stalls only its own connection. An end-of-file is passed on as a
// shutdown of the other side's writing; once both directions have ended, or either side fails,
// both sockets are closed.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "common/fd.hpp"
#include "service/ports/socket_poller.hpp"

namespace agentvm {

class ByteTunnel : public std::enable_shared_from_this<ByteTunnel> {
public:
    static constexpr size_t buffer_bytes = 256 * 1024;

    // A socket the tunnel does not own (MHD's upgraded connection): `close` gives it back.
    struct BorrowedSocket {
        int fd = -1;
        std::function<void()> close;
    };

    // `to_guest` and `to_client`: bytes already read from the other side, sent first.
    // on_closed runs once, after both sockets are closed.
    static std::shared_ptr<ByteTunnel> join(SocketPoller& poller, BorrowedSocket client, std::string to_guest,
                                            Fd guest, std::string to_client, std::function<void()> on_closed);
    ~ByteTunnel();
    ByteTunnel(const ByteTunnel&) = delete;
    ByteTunnel& operator=(const ByteTunnel&) = delete;

    // Closes both sockets now (serve is stopping, the sandbox ended).
    void close();
    // Told of every send's bytes, either way; returning false closes the tunnel (a budget
    // spent). Set right after join.
    void watch_bytes(std::function<bool(uint64_t bytes)> on_moved) { on_moved_ = std::move(on_moved); }
    uint64_t bytes_to_guest() const { return to_guest_.moved; }
    uint64_t bytes_to_client() const { return to_client_.moved; }

private:
    struct Direction {
        int from = -1;
        int to = -1;
        std::string pending;
        bool source_ended = false;  // end-of-file read; the shutdown follows once pending is out
        bool done = false;          // and passed on
        uint64_t moved = 0;
    };

    ByteTunnel(SocketPoller& poller, BorrowedSocket client, Fd guest, std::function<void()> on_closed);
    void start();
    void pump();
    // false: the tunnel failed and is closed.
    bool move(Direction& direction);

    SocketPoller& poller_;
    BorrowedSocket client_;
    Fd guest_;
    std::function<void()> on_closed_;
    std::function<bool(uint64_t)> on_moved_;
    Direction to_guest_;
    Direction to_client_;
    bool closed_ = false;
};

} // namespace agentvm
