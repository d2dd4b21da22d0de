// One envd RPC being answered (docs/e2b.md, "envd"): what its handler gets (RpcCall), how a
// unary one answers, and ConnectStream, a server stream's answer. A stream is 200
// application/connect+json from the start, its messages envelopes, and it always ends with
// exactly one end-of-stream envelope, which carries the RPC's error when it failed. While it is
// idle a keepalive message goes out every Keepalive-Ping-Interval seconds (as envd does, so that
// proxies keep the connection); Connect-Timeout-Ms, when given, ends it with deadline_exceeded.
// The agent call that feeds it (an attach, a watch) is followed: cancelled when the client goes
// away or the stream ends first, and paced by the client's reading (StreamPacer).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "core/event_loop.hpp"
#include "core/loop_timer.hpp"
#include "service/call_relay.hpp"
#include "service/e2b/connect_wire.hpp"
#include "service/http_server.hpp"
#include "service/sandbox.hpp"

namespace agentvm {

struct RpcCall {
    std::shared_ptr<HttpExchange> exchange;
    std::shared_ptr<Sandbox> sandbox;
    EventLoop* loop;
    Json message;  // the request message
    // The user of Authorization: Basic base64("name:"), which the SDK names for an RPC run as
    // someone other than the sandbox's default user.
    std::optional<std::string> user;
    std::optional<std::chrono::milliseconds> timeout;  // Connect-Timeout-Ms
    std::chrono::seconds keepalive{};                  // Keepalive-Ping-Interval, or envd's default
};

// The agent request of an RPC, with its user when it has one.
Json agent_request(const RpcCall& call, Json request);

// A unary RPC's answer: 200 application/json with `message`, or its error with the status
// Connect pairs with the code.
void answer_unary(HttpExchange& exchange, const Json& message);
void answer_unary_error(HttpExchange& exchange, const ConnectError& error);
// The error of an agent's answer ({"error":{code,message}}) as Connect's.
ConnectError connect_error_of_agent(const Json& answer);

// Sends `request` to the agent and answers the unary RPC with `map(answer)` (which may throw
// ConnectFailure), or with the agent's error.
template <typename Map>
void relay_unary(RpcCall& call, Json request, Map map);

class ConnectStream : public std::enable_shared_from_this<ConnectStream> {
public:
    // Starts the answer; its deadline is the call's timeout and `grace` (for a stream whose
    // own end is due at the timeout, so that it wins).
    static std::shared_ptr<ConnectStream> open(const RpcCall& call, Json keepalive,
                                               std::chrono::milliseconds grace = std::chrono::milliseconds(0));
    ~ConnectStream();
    ConnectStream(const ConnectStream&) = delete;
    ConnectStream& operator=(const ConnectStream&) = delete;

    // A message; from the first on, keepalives fill the silences.
    void send(const Json& message);
    // The end-of-stream envelope (once; later calls do nothing). A followed call still running
    // is cancelled.
    void end(const std::optional<ConnectError>& error = std::nullopt);
    bool ended() const { return ended_; }

    // Starts the agent call that feeds the stream (events to `on_event`, its answer to
    // `on_answer`, both guarded), recorded in the sandbox's history as `summary`.
    void follow(Json request, Json summary, std::function<void(Json&&)> on_event,
                std::function<void(Json&&)> on_answer);
    // Whether the client is still there to be answered.
    bool client_gone() const { return exchange_->gone() || exchange_->client_closed(); }

private:
    ConnectStream(const RpcCall& call, Json keepalive);
    void cancel_followed();

    std::shared_ptr<HttpExchange> exchange_;
    std::weak_ptr<Sandbox> sandbox_;
    std::shared_ptr<StreamPacer> pacer_;
    Json keepalive_message_;
    std::chrono::seconds keepalive_interval_;
    LoopTimer keepalive_;
    LoopTimer deadline_;
    std::optional<uint64_t> followed_;
    bool ended_ = false;
};

template <typename Map>
void relay_unary(RpcCall& call, Json request, Map map)
{
    auto exchange = call.exchange;
    auto on_answer = [exchange, map = std::move(map)](Json&& answer) {
        if (answer.contains("error"))
            return answer_unary_error(*exchange, connect_error_of_agent(answer));
        try {
            answer_unary(*exchange, map(answer));
        } catch (const ConnectFailure& e) {
            answer_unary_error(*exchange, e.error());
        }
    };
    Json summary{{"op", request.value("op", "")}};
    call.sandbox->call(agent_request(call, std::move(request)), std::move(summary),
                       answering(exchange, CallHandlers{[](Json&&) {}, std::move(on_answer)}));
}

} // namespace agentvm
