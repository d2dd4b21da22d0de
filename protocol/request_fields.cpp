#include "protocol/request_fields.hpp"

#include <cmath>

namespace agentvm {

[[noreturn]] void bad_field(const std::string& name, const std::string& why)
{
    throw CallError("bad_field", "\"" + name + "\" " + why);
}

const Json& require(const Json& object, const std::string& name)
{
    auto it = object.find(name);
    if (it == object.end())
        throw CallError("missing_field", "missing \"" + name + "\"");
    return *it;
}

std::string require_string(const Json& object, const std::string& name)
{
    const Json& value = require(object, name);
    if (!value.is_string())
        bad_field(name, "must be a string");
    return value.get<std::string>();
}

std::optional<std::string> optional_string(const Json& object, const std::string& name)
{
    auto it = object.find(name);
    if (it == object.end() || it->is_null())
        return std::nullopt;
    if (!it->is_string())
        bad_field(name, "must be a string");
    return it->get<std::string>();
}

bool optional_bool(const Json& object, const std::string& name)
{
    auto it = object.find(name);
    if (it == object.end() || it->is_null())
        return false;
    if (!it->is_boolean())
        bad_field(name, "must be true or false");
    return it->get<bool>();
}

constexpr double max_timeout_s = max_call_timeout_s;

std::optional<double> optional_timeout(const Json& object)
{
    auto timeout = object.find("timeout");
    if (timeout == object.end() || timeout->is_null())
        return std::nullopt;
    if (!timeout->is_number() || !std::isfinite(timeout->get<double>()) || timeout->get<double>() <= 0 ||
        timeout->get<double>() > max_timeout_s)
        bad_field("timeout", "must be a positive number of seconds, at most " + std::to_string(max_call_timeout_s));
    return timeout->get<double>();
}

uint64_t optional_max_output(const Json& object)
{
    auto max = object.find("max_output");
    if (max == object.end() || max->is_null())
        return default_max_output;
    if (!max->is_number_unsigned())
        bad_field("max_output", "must be a non-negative integer");
    return max->get<uint64_t>();
}

std::vector<std::string> parse_argv(const Json& object)
{
    std::vector<std::string> argv;
    const Json& value = require(object, "argv");
    if (!value.is_array() || value.empty())
        bad_field("argv", "must be a non-empty array of strings");
    for (const Json& arg : value) {
        if (!arg.is_string())
            bad_field("argv", "must be a non-empty array of strings");
        argv.push_back(arg.get<std::string>());
    }
    // execve takes NUL-terminated strings: an embedded NUL would silently cut the word.
    for (const std::string& arg : argv)
        if (arg.find('\0') != std::string::npos)
            bad_field("argv", "must not contain NUL");
    if (argv[0].empty())
        bad_field("argv", "must not start with an empty string");
    return argv;
}

std::map<std::string, std::string> parse_env(const Json& object)
{
    std::map<std::string, std::string> env;
    auto value = object.find("env");
    if (value == object.end() || value->is_null())
        return env;
    if (!value->is_object())
        bad_field("env", "must be an object of strings");
    for (const auto& [key, entry] : value->items()) {
        if (!entry.is_string() || key.empty() || key.find('=') != std::string::npos
            || key.find('\0') != std::string::npos
            || entry.get_ref<const std::string&>().find('\0') != std::string::npos)
            bad_field("env", "must map names (no '=' or NUL) to strings");
        env[key] = entry.get<std::string>();
    }
    return env;
}

std::optional<std::string> parse_user(const Json& object)
{
    std::optional<std::string> user = optional_string(object, "user");
    // ':' and '\n' separate /etc/passwd's fields and lines: a name with one is no user's.
    if (user && (user->empty() || user->size() > max_user_name_bytes
                 || user->find_first_of(std::string_view(":\n\0", 3)) != std::string::npos))
        bad_field("user", "must be a user name of 1 to " + std::to_string(max_user_name_bytes)
                              + " bytes, without ':', newline or NUL");
    return user;
}

std::optional<std::string> parse_tag(const Json& object)
{
    std::optional<std::string> tag = optional_string(object, "tag");
    if (tag && (tag->empty() || tag->size() > max_tag_bytes || tag->find('\0') != std::string::npos))
        bad_field("tag", "must be 1 to " + std::to_string(max_tag_bytes) + " bytes, without NUL");
    return tag;
}

} // namespace agentvm
