#include "service/create_request.hpp"

#include <cmath>

#include <fmt/format.h>

#include "protocol/env_limits.hpp"
#include "service/problem.hpp"

namespace agentvm {
std::chrono::seconds sandbox_seconds(const Json& value, const char* name)
{
    if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < 1
        || value.get<double>() > max_sandbox_timeout_s)
        throw_bad_field(fmt::format("\"{}\" must be a number of seconds from 1 to {}", name, max_sandbox_timeout_s));
    return std::chrono::seconds(std::llround(value.get<double>()));
}

CreateRequest parse_create_request(const std::string& body)
{
    CreateRequest request;
    if (body.empty())
        return request;
    const Json json = Json::parse(body, nullptr, false);
    if (!json.is_object())
        throw RefusedRequest(ServiceError::bad_json, "the body must be a JSON object");
    for (const auto& [key, value] : json.items()) {
        if (key == "pool" || key == "template") {
            // "template" as E2B's clients name it: a template pool is named by the template.
            if (!value.is_string() || value.get<std::string>().empty())
                throw_bad_field(fmt::format("\"{}\" must be a non-empty string", key));
            if (!request.pool.empty() && request.pool != value.get<std::string>())
                throw_bad_field("\"pool\" and \"template\" name different pools");
            request.pool = value.get<std::string>();
        } else if (key == "timeout") {
            request.settings.timeout = sandbox_seconds(value, "timeout");
        } else if (key == "idle_timeout") {
            if (!value.is_null())
                request.settings.idle_timeout = sandbox_seconds(value, "idle_timeout");
        } else if (key == "env") {
            if (!value.is_object() || value.size() > max_env_entries)
                throw_bad_field(fmt::format("\"env\" must be an object of at most {} strings", max_env_entries));
            for (const auto& [name, text] : value.items()) {
                if (!is_env_name(name))
                    throw_bad_field(fmt::format(
                        "\"env\": \"{}\" is not a variable name (letters, digits, _; not a digit first)", name));
                if (!text.is_string() || text.get<std::string>().find('\0') != std::string::npos)
                    throw_bad_field(fmt::format("\"env\": \"{}\" must be a string without NUL", name));
                request.settings.env[name] = text.get<std::string>();
            }
        } else if (key == "metadata") {
            if (!value.is_object() || value.size() > max_metadata_entries)
                throw_bad_field(
                    fmt::format("\"metadata\" must be an object of at most {} strings", max_metadata_entries));
            for (const auto& [name, text] : value.items()) {
                if (!text.is_string() || name.size() > 256 || text.get<std::string>().size() > 4096)
                    throw_bad_field(fmt::format(
                        "\"metadata\": \"{:.64}\" must be a string of at most 4096 bytes, its name at most 256", name));
            }
            request.settings.metadata = value;
        } else {
            throw_bad_field(fmt::format("unknown field \"{:.64}\" (pool or template, timeout, idle_timeout, env, metadata)", key));
        }
    }
    return request;
}

} // namespace agentvm
