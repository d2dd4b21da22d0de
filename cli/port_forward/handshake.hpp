// What a far end asks before its stream becomes the guest's TCP port: a few bytes each way.
// A Handshake is the protocol alone, with no descriptor (guest_dial.hpp drives it over a
// socket), so the unit tests feed it bytes directly.
#pragma once

#include <string>
#include <string_view>

namespace agentvm {

struct HandshakeStep {
    enum class Kind {
        need_more,  // nothing decided: read more
        send,       // write `text`, then read on
        done,       // the stream is now the guest's port; what is left in `received` is its first bytes
        refused,    // `text` says why; the connection is to be closed
    };
    Kind kind = Kind::need_more;
    std::string text;
};

class Handshake {
public:
    virtual ~Handshake() = default;
    // The bytes to write once the socket has connected.
    virtual std::string opening() = 0;
    // Called with what has arrived and not been consumed yet; consumes what it uses. `eof`:
    // the far end has closed its side. Each handshake bounds what it waits for: past its
    // limit it refuses, so `received` never grows without bound.
    virtual HandshakeStep advance(std::string& received, bool eof) = 0;
};

// A far end's line or reason as it may be logged: at most `limit` bytes, control bytes and
// non-ASCII as \xNN, so a hostile peer cannot forge log lines.
std::string printable(std::string_view text, size_t limit = 200);

} // namespace agentvm
