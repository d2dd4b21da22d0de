#include "service/e2b/connect_stream.hpp"

#include <fmt/format.h>

#include "service/e2b/e2b_errors.hpp"

namespace agentvm {

Json agent_request(const RpcCall& call, Json request)
{
    if (call.user)
        request["user"] = *call.user;
    return request;
}

void answer_unary(HttpExchange& exchange, const Json& message)
{
    exchange.respond(200, message.dump(-1, ' ', false, Json::error_handler_t::replace), connect_unary_type);
}

void answer_unary_error(HttpExchange& exchange, const ConnectError& error)
{
    exchange.respond(connect_status(error.code), connect_error_body(error), connect_unary_type);
}

ConnectError connect_error_of_agent(const Json& answer)
{
    const Json& error = json_field(answer, "error");
    if (!error.is_object())
        return {"internal", "the sandbox's agent answered an error without a code"};
    const std::string code = error.value("code", "internal");
    return {std::string(connect_code_of_agent(code)), error.value("message", code)};
}

std::shared_ptr<ConnectStream> ConnectStream::open(const RpcCall& call, Json keepalive,
                                                   std::chrono::milliseconds grace)
{
    std::shared_ptr<ConnectStream> stream(new ConnectStream(call, std::move(keepalive)));
    call.exchange->start_stream(200, connect_stream_type);
    if (call.timeout)
        stream->deadline_.arm(*call.timeout + grace);
    return stream;
}

ConnectStream::ConnectStream(const RpcCall& call, Json keepalive)
    : exchange_(call.exchange),
      sandbox_(call.sandbox),
      pacer_(std::make_shared<StreamPacer>(call.sandbox, call.exchange)),
      keepalive_message_(std::move(keepalive)),
      keepalive_interval_(call.keepalive),
      // Neither callback can end the stream's life: whatever holds the stream (its followed
      // call's handlers) still does once they return.
      keepalive_(*call.loop, [this] { send(keepalive_message_); }),
      deadline_(*call.loop,
                [this] {
                    end(ConnectError{"deadline_exceeded", "the call's deadline (Connect-Timeout-Ms) has passed"});
                })
{
}

ConnectStream::~ConnectStream()
{
    // Every stream ends with its end envelope, even one its handler let go of unended. Its
    // followed call, if any, has let go of it: answered, or forgotten with its client.
    followed_.reset();
    if (!ended_)
        end(ConnectError{"internal", "the stream was left without an end"});
}

void ConnectStream::send(const Json& message)
{
    if (ended_ || exchange_->gone())
        return;
    exchange_->write(connect_envelope(message.dump(-1, ' ', false, Json::error_handler_t::replace)));
    pacer_->after_write();
    if (keepalive_interval_.count() > 0)
        keepalive_.arm(keepalive_interval_);
}

void ConnectStream::end(const std::optional<ConnectError>& error)
{
    if (ended_)
        return;
    ended_ = true;
    keepalive_.cancel();
    deadline_.cancel();
    pacer_->release();
    exchange_->write(connect_end_stream(error));
    exchange_->finish();
    cancel_followed();
}

void ConnectStream::cancel_followed()
{
    auto sandbox = sandbox_.lock();
    if (!followed_ || !sandbox)
        return;
    if (const std::optional<uint64_t> seq = sandbox->history_seq_of(*followed_))
        sandbox->cancel(*seq, [](Json&&) {});
}

void ConnectStream::follow(Json request, Json summary, std::function<void(Json&&)> on_event,
                           std::function<void(Json&&)> on_answer)
{
    auto sandbox = sandbox_.lock();
    if (!sandbox)
        return end(ConnectError{"unavailable", "the sandbox has ended"});
    auto self = shared_from_this();
    CallHandlers handlers;
    handlers.on_event = [self, on_event = std::move(on_event)](Json&& event) {
        if (!self->ended_)
            on_event(std::move(event));
    };
    handlers.on_answer = [self, on_answer = std::move(on_answer)](Json&& answer) {
        self->followed_.reset();
        self->pacer_->release();
        if (!self->ended_)
            on_answer(std::move(answer));
    };
    request["stream"] = "only";
    followed_ = sandbox->call(std::move(request), std::move(summary), answering(exchange_, std::move(handlers)));
    forget_call_when_gone(*exchange_, sandbox, *followed_, pacer_, WhenGone::cancel);
}

} // namespace agentvm
