// Runs one agent call in a sandbox for one HTTP request and answers it (docs/api.md,
// "Calls"): the whole result as JSON, or, when streamed, NDJSON lines (each event, then the
// result) as they come, with backpressure: while the client has more than a few MiB unread,
// the sandbox's output waits. An agent error is answered in the facade's error shape.
#pragma once

#include <memory>

#include "service/http_server.hpp"
#include "service/sandbox.hpp"
#include "service/sandbox_manager.hpp"

namespace agentvm {

// Answers `exchange` with the agent's {"error":{"code","message"}}, in its facade's shape.
void respond_agent_error(HttpExchange& exchange, const Json& answer);

// What happens to a call whose client went away before it answered.
enum class WhenGone {
    forget,  // it runs on in the guest, recorded (a command the client started)
    cancel,  // the agent's cancel ends it (an attach, a watch: it only served that client)
};

// Sends `request` to the sandbox and answers `exchange` with its result; `stream` asks for
// NDJSON (the agent is then asked for "stream":"only").
void relay_call(const std::shared_ptr<Sandbox>& sandbox, const std::shared_ptr<HttpExchange>& exchange,
                Json request, Json summary, bool stream, WhenGone when_gone = WhenGone::forget);

// `handlers` of a call that answers `exchange`, each made unable to throw: an exception one
// lets out fails that request (HttpExchange::fail) instead of leaving through the sandbox's
// line reader to the event loop, which would end serve and every sandbox with it.
CallHandlers answering(const std::shared_ptr<HttpExchange>& exchange, CallHandlers handlers);

class StreamPacer;
// When the client goes away before the call answered: its pacer lets go of the sandbox's
// output, and the sandbox forgets the call (which runs on in the guest, recorded, unless
// `when_gone` cancels it first).
void forget_call_when_gone(HttpExchange& exchange, const std::shared_ptr<Sandbox>& sandbox, uint64_t call,
                           std::shared_ptr<StreamPacer> pacer, WhenGone when_gone = WhenGone::forget);

// Backpressure for an answer streamed to a slow client: after a write, holds the sandbox's
// output while more than high_water is unread, until it drains below low_water. Made with
// make_shared: the exchange's drain callback holds it weakly, as the exchange may outlive it.
class StreamPacer : public std::enable_shared_from_this<StreamPacer> {
public:
    static constexpr size_t high_water = size_t{4} << 20;
    static constexpr size_t low_water = size_t{1} << 20;

    StreamPacer(std::weak_ptr<Sandbox> sandbox, std::weak_ptr<HttpExchange> exchange)
        : sandbox_(std::move(sandbox)), exchange_(std::move(exchange))
    {
    }
    ~StreamPacer() { release(); }
    StreamPacer(const StreamPacer&) = delete;
    StreamPacer& operator=(const StreamPacer&) = delete;

    void after_write();
    void release();

private:
    std::weak_ptr<Sandbox> sandbox_;
    std::weak_ptr<HttpExchange> exchange_;
    bool holding_ = false;
};

} // namespace agentvm
