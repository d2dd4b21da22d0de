#include "service/e2b/e2b_errors.hpp"

#include <array>
#include <utility>

#include "service/native/native_wire.hpp"

namespace agentvm {
namespace {

struct AgentCode {
    std::string_view agent;
    std::string_view connect;
    int status;
};

// The agent's codes (docs/protocol.md, "Errors") as Connect codes and HTTP statuses.
constexpr std::array agent_codes{
    AgentCode{"bad_json", "invalid_argument", 400},
    AgentCode{"bad_field", "invalid_argument", 400},
    AgentCode{"missing_field", "invalid_argument", 400},
    AgentCode{"not_found", "not_found", 404},
    AgentCode{"spawn_failed", "failed_precondition", 400},
    AgentCode{"io", "internal", 500},
    AgentCode{"exists", "already_exists", 409},
    AgentCode{"not_empty", "failed_precondition", 400},
    AgentCode{"stdin_closed", "failed_precondition", 400},
    AgentCode{"limit", "resource_exhausted", 429},
    AgentCode{"line_too_long", "resource_exhausted", 413},
    AgentCode{"unknown_op", "unimplemented", 501},
    // The episode's, when the VM under the call went away.
    AgentCode{"vm_died", "unavailable", 502},
    AgentCode{"stopped", "unavailable", 502},
};

const AgentCode* find_agent_code(std::string_view code)
{
    for (const AgentCode& entry : agent_codes)
        if (entry.agent == code)
            return &entry;
    return nullptr;
}

std::string error_body(int status, const std::string& message)
{
    return json_text(Json{{"code", status}, {"message", message}});
}

class ControlErrors : public ErrorWriter {
public:
    Answer refusal(const Refusal& refusal) const override
    {
        const int status = e2b_status(refusal.code);
        return {status, error_body(status, refusal.message), "application/json"};
    }
    Answer agent_error(const std::string& code, const std::string& message) const override
    {
        const int status = e2b_agent_status(code);
        return {status, error_body(status, message), "application/json"};
    }
};

class ConnectErrors : public ErrorWriter {
public:
    Answer refusal(const Refusal& refusal) const override { return answer(connect_code(refusal.code), refusal.message); }
    Answer agent_error(const std::string& code, const std::string& message) const override
    {
        return answer(connect_code_of_agent(code), message);
    }

private:
    static Answer answer(std::string_view code, const std::string& message)
    {
        return {connect_status(code), json_text(Json{{"code", code}, {"message", message}}), "application/json"};
    }
};

} // namespace

int e2b_status(ServiceError code)
{
    switch (code) {
    case ServiceError::at_capacity:
        return 429;
    case ServiceError::paused:
    case ServiceError::not_paused:
    case ServiceError::busy:
    case ServiceError::resuming:
        return 409;
    // A sandbox that is gone or never was, as E2B's proxy answers for one.
    case ServiceError::ended:
        return 502;
    default:
        return native_status(code);
    }
}

int e2b_agent_status(std::string_view agent_code)
{
    const AgentCode* entry = find_agent_code(agent_code);
    return entry ? entry->status : 500;
}

std::string_view connect_code(ServiceError code)
{
    switch (code) {
    case ServiceError::bad_json:
    case ServiceError::bad_field:
    case ServiceError::missing_field:
    case ServiceError::method_not_allowed:
    case ServiceError::unsupported_transfer_encoding:
        return "invalid_argument";
    case ServiceError::unauthorized:
        return "unauthenticated";
    case ServiceError::forbidden:
        return "permission_denied";
    case ServiceError::not_found:
    case ServiceError::unknown_pool:
        return "not_found";
    case ServiceError::body_too_large:
    case ServiceError::at_capacity:
    case ServiceError::memory_reserve:
        return "resource_exhausted";
    case ServiceError::paused:
    case ServiceError::not_paused:
    case ServiceError::busy:
    case ServiceError::resuming:
    case ServiceError::upload_in_progress:
    case ServiceError::idempotency_conflict:
        return "failed_precondition";
    case ServiceError::ended:
    case ServiceError::sandbox_lost:
    case ServiceError::port_unreachable:
    case ServiceError::draining:
    case ServiceError::shutting_down:
    case ServiceError::start_failed:
        return "unavailable";
    case ServiceError::unavailable:
        return "unimplemented";
    case ServiceError::snapshot_failed:
    case ServiceError::internal:
        return "internal";
    }
    return "unknown";
}

std::string_view connect_code_of_agent(std::string_view agent_code)
{
    const AgentCode* entry = find_agent_code(agent_code);
    return entry ? entry->connect : "internal";
}

int connect_status(std::string_view code)
{
    // Connect's table of codes and the HTTP statuses that carry them.
    static constexpr std::array<std::pair<std::string_view, int>, 16> statuses{{
        {"canceled", 499},
        {"unknown", 500},
        {"invalid_argument", 400},
        {"deadline_exceeded", 504},
        {"not_found", 404},
        {"already_exists", 409},
        {"permission_denied", 403},
        {"resource_exhausted", 429},
        {"failed_precondition", 400},
        {"aborted", 409},
        {"out_of_range", 400},
        {"unimplemented", 501},
        {"internal", 500},
        {"unavailable", 503},
        {"data_loss", 500},
        {"unauthenticated", 401},
    }};
    for (const auto& [name, status] : statuses)
        if (name == code)
            return status;
    return 500;
}

const ErrorWriter& e2b_control_errors()
{
    static const ControlErrors writer;
    return writer;
}

const ErrorWriter& e2b_connect_errors()
{
    static const ConnectErrors writer;
    return writer;
}

const ErrorWriter& e2b_http_errors()
{
    // The same shape as the control plane's: envd's REST errors and the interpreter's are
    // read by their HTTP status, with the message from {"message"}.
    return e2b_control_errors();
}

} // namespace agentvm
