#include "service/native/native_wire.hpp"

#include "service/wall_clock.hpp"

namespace agentvm {

std::string json_text(const Json& value)
{
    return value.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

Json sandbox_json(const Sandbox& sandbox)
{
    const Sandbox::Status status = sandbox.status();
    const Sandbox::Settings& settings = sandbox.settings();
    return Json{{"id", settings.id},
                {"pool", sandbox.pool()},
                {"state", status.stopping ? "stopping" : "running"},
                {"start", status.warm ? "warm" : "cold"},
                {"restored", status.restored},
                {"pid", status.pid},
                {"create_ms", status.create_time.count()},
                {"created_at", unix_seconds(status.created_at)},
                {"expires_at", unix_seconds(status.expires_at)},
                {"timeout", settings.timeout.count()},
                {"idle_timeout", settings.idle_timeout ? Json(settings.idle_timeout->count()) : Json(nullptr)},
                {"metadata", settings.metadata},
                {"calls_running", status.calls_running},
                {"calls", status.calls}};
}

Json paused_json(const PausedSandbox& paused)
{
    return Json{{"id", paused.settings.id},
                {"pool", paused.pool},
                {"state", "paused"},
                {"paused_at", paused.paused_at},
                {"retain_until", paused.retain_until},
                {"disk_bytes", paused.disk_bytes},
                {"timeout", paused.settings.timeout.count()},
                {"idle_timeout",
                 paused.settings.idle_timeout ? Json(paused.settings.idle_timeout->count()) : Json(nullptr)},
                {"metadata", paused.settings.metadata}};
}

int native_status(ServiceError code)
{
    switch (code) {
    case ServiceError::bad_json:
    case ServiceError::bad_field:
    case ServiceError::missing_field:
        return 400;
    case ServiceError::unauthorized:
        return 401;
    case ServiceError::forbidden:
        return 403;
    case ServiceError::not_found:
    case ServiceError::unknown_pool:
        return 404;
    case ServiceError::method_not_allowed:
        return 405;
    case ServiceError::sandbox_lost:
        return 410;
    case ServiceError::paused:
    case ServiceError::not_paused:
    case ServiceError::busy:
    case ServiceError::resuming:
    case ServiceError::ended:
    case ServiceError::upload_in_progress:
        return 409;
    case ServiceError::body_too_large:
        return 413;
    // As the IETF's Idempotency-Key draft answers a key reused with another payload.
    case ServiceError::idempotency_conflict:
        return 422;
    case ServiceError::at_capacity:
        return 429;
    case ServiceError::start_failed:
    case ServiceError::snapshot_failed:
    case ServiceError::internal:
        return 500;
    case ServiceError::unavailable:
    case ServiceError::unsupported_transfer_encoding:
        return 501;
    // As a proxy answers for an upstream that does not (RFC 9110 15.6.3).
    case ServiceError::port_unreachable:
        return 502;
    case ServiceError::memory_reserve:
    case ServiceError::draining:
    case ServiceError::shutting_down:
        return 503;
    }
    return 500;
}

std::span<const AgentErrorStatus> native_agent_statuses()
{
    static constexpr AgentErrorStatus table[] = {
        {"bad_json", 400},      {"missing_field", 400}, {"bad_field", 400},
        {"unknown_op", 400},    {"line_too_long", 400},
        // The request was well-formed; the guest could not do it.
        {"not_found", 422},     {"spawn_failed", 422},  {"io", 422},
        {"exists", 422},        {"not_empty", 422},     {"stdin_closed", 422},
        {"limit", 422},
        // The sandbox's VM failed under the call.
        {"vm_died", 502},       {"agent_died", 502},    {"watchdog", 502},
        {"stopped", 502},       {"episode_timeout", 502},
    };
    return table;
}

int native_agent_status(std::string_view code)
{
    for (const AgentErrorStatus& entry : native_agent_statuses())
        if (entry.code == code)
            return entry.status;
    return 500;
}

namespace {

class NativeErrors : public ErrorWriter {
public:
    Answer refusal(const Refusal& refusal) const override
    {
        Answer answer = body(native_status(refusal.code), error_name(refusal.code), refusal.message);
        if (!refusal.node.empty())
            answer.body = json_text(
                Json{{"error", error_name(refusal.code)}, {"message", refusal.message}, {"node", refusal.node}});
        return answer;
    }
    Answer agent_error(const std::string& code, const std::string& message) const override
    {
        return body(native_agent_status(code), code, message);
    }

private:
    static Answer body(int status, std::string_view code, const std::string& message)
    {
        return Answer{status, json_text(Json{{"error", code}, {"message", message}}), "application/json"};
    }
};

} // namespace

const ErrorWriter& native_errors()
{
    static const NativeErrors errors;
    return errors;
}

} // namespace agentvm
