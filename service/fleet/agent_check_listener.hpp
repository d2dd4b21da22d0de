// serve's HAProxy agent-check port (--agent-check tcp:HOST:PORT; docs/api.md): HAProxy
// connects, serve writes one line (CapacityReport::agent_line) and closes. It reads nothing
// the client says beyond a bounded discard, so a client that sends garbage or floods it with
// connections costs serve at most `max_accepts_per_wake` accepts and sends per turn of the
// event loop, never a blocking call. It answers until it is destroyed: while serve drains
// (its HTTP listeners already closed) it goes on telling the balancer "drain".
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "common/fd.hpp"
#include "core/event_loop.hpp"
#include "core/loop_timer.hpp"

namespace agentvm {

class AgentCheckListener {
public:
    // `listener`: a listening TCP socket, O_NONBLOCK. `line`: what each connection is told.
    AgentCheckListener(EventLoop& loop, Fd listener, std::function<std::string()> line);
    ~AgentCheckListener();
    AgentCheckListener(const AgentCheckListener&) = delete;
    AgentCheckListener& operator=(const AgentCheckListener&) = delete;

    static constexpr unsigned max_accepts_per_wake = 32;

    uint64_t answered() const { return answered_; }

private:
    void on_readable();
    void answer(int connection);

    EventLoop& loop_;
    Fd listener_;
    std::function<std::string()> line_;
    // Out of descriptors: the listener stays readable, so it is unwatched for a while rather
    // than woken at once again and again.
    LoopTimer resume_;
    bool watching_ = false;
    uint64_t answered_ = 0;
};

} // namespace agentvm
