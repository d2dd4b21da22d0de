// Collecting one output stream (stdout or stderr) of a call: keeps up to max_output bytes,
// reads and discards the rest so the writer never blocks, and optionally streams what it
// keeps as events. Shared by exec and shell.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "guest/agent/outbox.hpp"
#include "guest/agent/protocol.hpp"
#include "vmm/fd.hpp"

namespace agentvm {

// Once a call's command has finished, output still in flight is read until its pipes
// close, but a background process that keeps them open must not hold the call: reading
// stops once they stay quiet this long, or after the cap whatever they do.
constexpr std::chrono::milliseconds quiet_after_exit{50};
constexpr std::chrono::milliseconds drain_cap_after_exit{500};

class Capture {
public:
    // `name` is "stdout" or "stderr": the event name and the response field.
    Capture(const char* name, Fd fd, uint64_t limit);

    int fd() const { return fd_.get(); }
    bool open() const { return static_cast<bool>(fd_); }
    // One non-blocking read. Returns whether bytes arrived; closes the fd at end of file.
    bool read_some(const Json& id, bool stream, Outbox& outbox);
    void close() { fd_.reset(); }
    // Adds "<name>" or "<name>_b64", and "<name>_truncated".
    void put(Json& response) const;

private:
    const char* name_;
    Fd fd_;
    uint64_t limit_;
    std::string kept_;
    bool truncated_ = false;
};

} // namespace agentvm
