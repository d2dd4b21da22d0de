#include "service/create_request.hpp"

#include <cmath>

#include <fmt/format.h>

#include "common/error.hpp"
#include "protocol/env_limits.hpp"
#include "service/egress/egress_policy.hpp"
#include "service/problem.hpp"

namespace agentvm {
std::chrono::seconds sandbox_seconds(const Json& value, const char* name)
{
    if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < 1
        || value.get<double>() > max_sandbox_timeout_s)
        throw_bad_field(fmt::format("\"{}\" must be a number of seconds from 1 to {}", name, max_sandbox_timeout_s));
    return std::chrono::seconds(std::llround(value.get<double>()));
}

EgressRules parse_egress_field(const Json& value)
{
    if (!value.is_object())
        throw_bad_field("\"egress\" must be an object: {\"allow\": [rules], \"deny\": [rules]}");
    EgressRules rules;
    for (const auto& [key, list] : value.items()) {
        if (key != "allow" && key != "deny")
            throw_bad_field(fmt::format("\"egress\": unknown field \"{:.64}\" (allow, deny)", key));
        if (!list.is_array() || list.size() > max_egress_rules)
            throw_bad_field(fmt::format("\"egress\": \"{}\" must be an array of at most {} strings", key,
                                        max_egress_rules));
        for (const Json& rule : list) {
            if (!rule.is_string())
                throw_bad_field(fmt::format("\"egress\": \"{}\" must hold strings", key));
            (key == "allow" ? rules.allow : rules.deny).push_back(rule.get<std::string>());
        }
    }
    try {
        EgressPolicy::parse(rules.allow, rules.deny);
    } catch (const Error& e) {
        throw_bad_field(fmt::format("\"egress\": {}", e.what()));
    }
    return rules;
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
        } else if (key == "egress") {
            request.settings.egress = parse_egress_field(value);
        } else {
            throw_bad_field(fmt::format(
                "unknown field \"{:.64}\" (pool or template, timeout, idle_timeout, env, metadata, egress)", key));
        }
    }
    return request;
}

} // namespace agentvm
