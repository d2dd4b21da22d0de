// Why serve refuses a request or an operation, in serve's own terms: a code and a message,
// never an HTTP status or a wire shape. Each facade (service/native/, service/fusion/) maps
// the codes onto its own statuses and bodies. Errors the guest's agent answers a call with
// keep the agent's code (docs/protocol.md) and are mapped by the facades the same way.
#pragma once

#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace agentvm {

enum class ServiceError {
    bad_json,            // the body is not a JSON object, or nests too deep
    bad_field,           // a field has the wrong type or value
    missing_field,       // a required field is absent
    unauthorized,        // no valid credentials
    forbidden,           // no token is set, and the client is not one of this host's own
    not_found,           // no such endpoint, sandbox or call
    unknown_pool,        // a create names a pool serve does not have
    method_not_allowed,  // the endpoint takes another method
    paused,              // the sandbox is paused: it must be resumed first
    not_paused,          // a resume of a sandbox that runs
    busy,                // the sandbox is being forked or paused already
    resuming,            // the paused sandbox is being resumed already
    ended,               // the sandbox ended while the operation ran
    upload_in_progress,  // another upload to the same path is still writing
    body_too_large,      // the body is over the limit
    at_capacity,         // as many VMs run as serve allows
    start_failed,        // the sandbox's VM did not start
    snapshot_failed,     // the sandbox's live snapshot failed
    internal,            // serve failed answering
    unavailable,         // this serve was started without what the operation needs
    unsupported_transfer_encoding,
    memory_reserve,      // the host is under its memory reserve
    draining,            // serve is shutting down and takes no new work
    shutting_down,       // serve stopped while the request waited for its answer
    sandbox_lost,        // the sandbox's node is gone or its serve restarted (docs/fleet.md)
    idempotency_conflict,  // a create's Idempotency-Key was used with another request
    port_unreachable,    // nothing answers on the sandbox's guest port (docs/api.md, "Ports")
};

// The code's name on every wire ("bad_json", ...).
std::string_view error_name(ServiceError code);
// Every code, for the documentation check and the facades' tables.
std::span<const ServiceError> all_service_errors();

struct Refusal {
    Refusal(ServiceError error_code, std::string text, std::optional<int> retry_after = std::nullopt,
            std::string lost_node = {})
        : code(error_code), message(std::move(text)), retry_after_s(retry_after), node(std::move(lost_node))
    {
    }
    ServiceError code;
    std::string message;
    std::optional<int> retry_after_s;  // when a retry may succeed
    std::string node;  // the node a sandbox_lost names, for the wires that carry it apart
};

// A request refused while it is parsed or routed; caught by the facade that routes it.
class RefusedRequest : public std::runtime_error {
public:
    RefusedRequest(ServiceError error_code, const std::string& message)
        : std::runtime_error(message), code(error_code)
    {
    }
    ServiceError code;
};

// A field of the request's body has the wrong type or value.
[[noreturn]] inline void throw_bad_field(const std::string& message)
{
    throw RefusedRequest(ServiceError::bad_field, message);
}

} // namespace agentvm
