// The watch call: changes under a directory (and, recursive, under its subdirectories, also
// those that appear later) reported as events through inotify, until the call is cancelled,
// its connection ends its requests, or the directory goes. A long call: it runs on a thread
// of its own (Connection::start_call) with the call's user's file credentials (fs_user.hpp).
#pragma once

#include <cstddef>

#include "common/fd.hpp"
#include "guest/agent/outbox.hpp"
#include "protocol/agent_protocol.hpp"

namespace agentvm {

// What one recursive watch may watch: kernel memory (about 1 KiB a watch) and the scan that
// sets it up stay bounded whatever the tree.
constexpr size_t max_watched_directories = 8192;
// Watches running at once in the agent, each with an inotify instance (the kernel allows 128
// per user by default) and a thread.
constexpr size_t max_watches = 64;

// Readable once a connection's peer can send no more requests (it sent close, or shut down
// its sending side): nothing could cancel a watch then, and `close` or the end of an episode
// would wait for it forever, so its watches end.
class EndOfRequests {
public:
    EndOfRequests();  // throws Error
    void signal();
    int fd() const { return fd_.get(); }

private:
    Fd fd_;
};

// Sends the events and returns the final response once cancel_fd or requests_ended_fd is
// readable or the directory is gone. Throws CallError (not_found, io, limit) when it cannot
// start.
Json run_watch(const Json& id, const WatchRequest& request, Outbox& outbox, int cancel_fd, int requests_ended_fd);

} // namespace agentvm
