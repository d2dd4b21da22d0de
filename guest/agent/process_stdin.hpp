// The stdin of a spawned process that asked for one ("stdin":true, or its pty): send_stdin
// queues bytes from a connection's thread, the process's own I/O thread writes them as the
// pipe takes them (a Watch of its drain), so a process that does not read never blocks a
// connection; close_stdin closes the pipe once what was queued before it is written.
#pragma once

#include <mutex>
#include <string>
#include <string_view>

#include "guest/agent/drain.hpp"
#include "common/fd.hpp"

namespace agentvm {

class ProcessStdin final : public Watch {
public:
    // Bytes that may wait for the process to read them; send_stdin past it is refused.
    static constexpr size_t max_pending_bytes = size_t{8} << 20;

    // `pipe`: the writing end (a pty's master for a pty: never closed by close()).
    ProcessStdin(Fd pipe, bool is_pty);

    // From any thread. Throw CallError: stdin_closed, limit, bad_field (close of a pty).
    void feed(std::string_view data);
    void close();

    // Watch, on the I/O thread: the wake-up eventfd while nothing waits, else the pipe.
    int fd() const override;
    short events() const override;
    bool ready(short revents) override;
    void over() override;

private:
    void write_pending();  // with mutex_ held

    mutable std::mutex mutex_;
    Fd pipe_;
    Fd wake_;
    bool is_pty_;
    std::string pending_;
    bool close_requested_ = false;
    bool closed_ = false;  // by close(), a broken pipe, or the process's end
};

} // namespace agentvm
