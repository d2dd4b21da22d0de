#include "service/problem.hpp"

#include <array>
#include <utility>

namespace agentvm {
namespace {

constexpr std::array<std::pair<ServiceError, std::string_view>, 27> names{{
    {ServiceError::bad_json, "bad_json"},
    {ServiceError::bad_field, "bad_field"},
    {ServiceError::missing_field, "missing_field"},
    {ServiceError::unauthorized, "unauthorized"},
    {ServiceError::forbidden, "forbidden"},
    {ServiceError::not_found, "not_found"},
    {ServiceError::unknown_pool, "unknown_pool"},
    {ServiceError::method_not_allowed, "method_not_allowed"},
    {ServiceError::paused, "paused"},
    {ServiceError::not_paused, "not_paused"},
    {ServiceError::busy, "busy"},
    {ServiceError::resuming, "resuming"},
    {ServiceError::ended, "ended"},
    {ServiceError::upload_in_progress, "upload_in_progress"},
    {ServiceError::body_too_large, "body_too_large"},
    {ServiceError::at_capacity, "at_capacity"},
    {ServiceError::start_failed, "start_failed"},
    {ServiceError::snapshot_failed, "snapshot_failed"},
    {ServiceError::internal, "internal"},
    {ServiceError::unavailable, "unavailable"},
    {ServiceError::unsupported_transfer_encoding, "unsupported_transfer_encoding"},
    {ServiceError::memory_reserve, "memory_reserve"},
    {ServiceError::draining, "draining"},
    {ServiceError::shutting_down, "shutting_down"},
    {ServiceError::sandbox_lost, "sandbox_lost"},
    {ServiceError::idempotency_conflict, "idempotency_conflict"},
    {ServiceError::port_unreachable, "port_unreachable"},
}};

constexpr std::array<ServiceError, names.size()> codes = [] {
    std::array<ServiceError, names.size()> out{};
    for (size_t i = 0; i < names.size(); ++i)
        out[i] = names[i].first;
    return out;
}();

// The table is in the enum's order, so a code's name is found by its value.
constexpr bool in_enum_order = [] {
    for (size_t i = 0; i < names.size(); ++i)
        if (static_cast<size_t>(names[i].first) != i)
            return false;
    return static_cast<size_t>(ServiceError::port_unreachable) + 1 == names.size();
}();
static_assert(in_enum_order, "every ServiceError has its name, in the enum's order");

} // namespace

std::string_view error_name(ServiceError code)
{
    return names[static_cast<size_t>(code)].second;
}

std::span<const ServiceError> all_service_errors()
{
    return codes;
}

} // namespace agentvm
