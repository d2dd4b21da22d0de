// A request serve refuses: the HTTP status and error code it is answered with (docs/api.md,
// "Errors"). Thrown by request parsing, caught where the request is routed.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

namespace agentvm {

class ApiError : public std::runtime_error {
public:
    ApiError(int http_status, std::string error_code, const std::string& message)
        : std::runtime_error(message), status(http_status), code(std::move(error_code))
    {
    }
    int status;
    std::string code;
};

// 400 bad_field: a field of the request's body has the wrong type or value.
[[noreturn]] inline void throw_bad_field(const std::string& message)
{
    throw ApiError(400, "bad_field", message);
}

} // namespace agentvm
