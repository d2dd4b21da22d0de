// One forwarded connection once its handshake is done: the local client's socket and the
// guest's stream, bytes copied unchanged both ways through a bounded buffer per direction.
// A side whose peer is slow is not read while its buffer is full (the kernel's own buffers
// then push back on the sender); end-of-file on one side becomes shutdown(SHUT_WR) on the
// other once the buffer has drained; both fds are closed (by the owner) when both
// directions have ended.
#pragma once

#include <poll.h>

#include <cstdint>
#include <memory>
#include <string>

#include "common/fd.hpp"

namespace agentvm {

class Splice {
public:
    static constexpr size_t buffer_size = 64 * 1024;

    // early: the guest's bytes that arrived with the handshake, the first to go to the client.
    Splice(Fd client, Fd guest, std::string early);

    int client_fd() const { return client_.get(); }
    int guest_fd() const { return guest_.get(); }
    // What each side is to be polled for; 0: leave it out of the poll (so a hung-up socket
    // we are not reading does not wake the loop over and over).
    short client_events() const;
    short guest_events() const;
    // Moves what it can, without blocking, after either side polled ready.
    void pump();
    bool finished() const { return up_.ended() && down_.ended(); }

    uint64_t bytes_up() const { return up_.total; }    // client to guest
    uint64_t bytes_down() const { return down_.total; }  // guest to client
    // The first socket error either direction met ("" if none), for the log.
    const std::string& problem() const { return problem_; }

private:
    struct Direction {
        std::unique_ptr<char[]> buffer{new char[buffer_size]};
        size_t begin = 0;  // buffered bytes are [begin, end)
        size_t end = 0;
        bool eof = false;     // the source ended (or failed reading)
        bool shut = false;    // the destination got its shutdown(SHUT_WR)
        bool failed = false;  // the destination cannot take bytes any more
        uint64_t total = 0;
        const char* source = "";       // for messages: "the client", "the guest"
        const char* destination = "";

        bool wants_read() const { return !eof && !failed && end - begin < buffer_size; }
        bool has_bytes() const { return !failed && end > begin; }
        bool ended() const { return failed || shut; }
    };

    // One read and the writes it allows, for one direction; true when anything moved.
    bool pump(Direction& direction, int from, int to, Direction& reverse);
    void note(const char* doing, const char* whom, int err);

    Fd client_;
    Fd guest_;
    Direction up_;    // client -> guest
    Direction down_;  // guest -> client
    std::string problem_;
};

} // namespace agentvm
