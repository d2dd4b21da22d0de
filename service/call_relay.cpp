#include "service/call_relay.hpp"

#include <fmt/format.h>

namespace agentvm {

void respond_agent_error(HttpExchange& exchange, const Json& answer)
{
    const Json& error = answer["error"];
    const std::string code = error.is_object() ? error.value("code", "internal") : "internal";
    const std::string message = error.is_object() ? error.value("message", "") : "";
    exchange.respond_agent_error(code, message);
}

namespace {

std::function<void(Json&&)> guarded(const std::shared_ptr<HttpExchange>& exchange,
                                    std::function<void(Json&&)> handler)
{
    if (!handler)
        return handler;
    return [exchange, handler = std::move(handler)](Json&& message) {
        try {
            handler(std::move(message));
        } catch (const std::exception& e) {
            exchange->fail(e);
        }
    };
}

} // namespace

CallHandlers answering(const std::shared_ptr<HttpExchange>& exchange, CallHandlers handlers)
{
    return CallHandlers{guarded(exchange, std::move(handlers.on_event)),
                        guarded(exchange, std::move(handlers.on_answer))};
}

void StreamPacer::after_write()
{
    auto exchange = exchange_.lock();
    auto sandbox = sandbox_.lock();
    if (holding_ || !exchange || !sandbox || exchange->buffered() <= high_water)
        return;
    holding_ = true;
    sandbox->hold_output();
    exchange->on_drained(low_water, [weak = weak_from_this()] {
        if (auto pacer = weak.lock())
            pacer->release();
    });
}

void StreamPacer::release()
{
    if (!holding_)
        return;
    holding_ = false;
    if (auto sandbox = sandbox_.lock())
        sandbox->release_output();
}

namespace {

std::string ndjson_line(const Json& message)
{
    return message.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

} // namespace

void relay_call(const std::shared_ptr<Sandbox>& sandbox, const std::shared_ptr<HttpExchange>& exchange,
                Json request, Json summary, bool stream, WhenGone when_gone)
{
    if (stream)
        request["stream"] = "only";
    auto pacer = std::make_shared<StreamPacer>(sandbox, exchange);
    CallHandlers handlers;
    handlers.on_event = [exchange, pacer, stream](Json&& event) {
        if (!stream)
            return;
        exchange->write(ndjson_line(event));
        pacer->after_write();
    };
    handlers.on_answer = [exchange, pacer, stream](Json&& answer) {
        pacer->release();
        if (stream) {
            if (answer.contains("error") && answer["error"].is_object()) {
                const Json& error = answer["error"];
                answer = Json{{"error", error.value("code", "internal")}, {"message", error.value("message", "")}};
            }
            exchange->write(ndjson_line(answer));
            exchange->finish();
        } else if (answer.contains("error")) {
            respond_agent_error(*exchange, answer);
        } else {
            exchange->respond(200, ndjson_line(answer));
        }
    };
    // Its lines come from the event loop, never from within call(): the answer starts after.
    const uint64_t call =
        sandbox->call(std::move(request), std::move(summary), answering(exchange, std::move(handlers)));
    if (const std::optional<uint64_t> seq = sandbox->history_seq_of(call))
        exchange->add_header("X-Agentvm-Call", std::to_string(*seq));
    if (stream)
        exchange->start_stream(200, "application/x-ndjson");
    forget_call_when_gone(*exchange, sandbox, call, std::move(pacer), when_gone);
}

void forget_call_when_gone(HttpExchange& exchange, const std::shared_ptr<Sandbox>& sandbox, uint64_t call,
                           std::shared_ptr<StreamPacer> pacer, WhenGone when_gone)
{
    std::weak_ptr<Sandbox> weak = sandbox;
    exchange.on_gone([weak, call, pacer = std::move(pacer), when_gone] {
        pacer->release();
        auto s = weak.lock();
        if (!s)
            return;
        if (when_gone == WhenGone::cancel)
            if (const std::optional<uint64_t> seq = s->history_seq_of(call))
                s->cancel(*seq, [](Json&&) {});
        s->forget(call);
    });
}

} // namespace agentvm
