// Collecting one output stream (stdout or stderr) of a call: keeps up to max_output bytes,
// reads and discards the rest so the writer never blocks, and optionally streams what it
// keeps as events ("stream":"only": streams it without holding it). Shared by exec and shell.
#pragma once

#include <cstdint>
#include <string>

#include "guest/agent/outbox.hpp"
#include "protocol/agent_protocol.hpp"
#include "common/fd.hpp"

namespace agentvm {

class Process;

class Capture {
public:
    // `name` is "stdout" or "stderr": the event name and the response field. Without
    // `in_response` the bytes are only counted against `limit`, never held.
    Capture(const char* name, Fd fd, uint64_t limit, bool in_response);

    // Every byte read also goes to `process`'s output, for its attachments.
    void tee_to(Process* process) { tee_ = process; }

    int fd() const { return fd_.get(); }
    bool open() const { return static_cast<bool>(fd_); }
    // One non-blocking read. Returns whether bytes arrived; closes the fd at end of file.
    // Streams what it keeps as events for `id` through `stream_to` when given.
    bool read_some(const Json& id, Outbox* stream_to);
    // Adds "<name>" or "<name>_b64" (when in the response), and "<name>_truncated", moving
    // the kept bytes out: once, at the end of the call.
    void put(Json& response);

private:
    const char* name_;
    Fd fd_;
    uint64_t limit_;
    bool in_response_;
    uint64_t kept_bytes_ = 0;
    std::string kept_;  // when in_response_
    bool truncated_ = false;
    Process* tee_ = nullptr;
};

} // namespace agentvm
