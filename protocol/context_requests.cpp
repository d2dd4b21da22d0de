#include "protocol/context_requests.hpp"

#include "protocol/agent_protocol.hpp"
#include "protocol/request_fields.hpp"

namespace agentvm {

namespace {

std::string context_name(const Json& value)
{
    if (!value.is_string() || value.get_ref<const std::string&>().empty()
        || value.get_ref<const std::string&>().size() > max_context_name_bytes)
        bad_field("context", "must be a context's name (a string of 1 to " + std::to_string(max_context_name_bytes)
                                 + " bytes, such as \"ctx-1\")");
    return value.get<std::string>();
}

} // namespace

std::string_view language_name(CodeLanguage language)
{
    return language == CodeLanguage::bash ? "bash" : "python";
}

std::optional<CodeLanguage> optional_language(const Json& object)
{
    const std::optional<std::string> language = optional_string(object, "language");
    if (!language)
        return std::nullopt;
    if (*language == "python")
        return CodeLanguage::python;
    if (*language == "bash")
        return CodeLanguage::bash;
    bad_field("language", "must be \"python\" or \"bash\"");
}

std::optional<std::string> optional_context(const Json& object)
{
    const auto it = object.find("context");
    if (it == object.end() || it->is_null())
        return std::nullopt;
    return context_name(*it);
}

CreateContextRequest parse_create_context(const Json& object)
{
    CreateContextRequest create;
    create.language = optional_language(object).value_or(CodeLanguage::python);
    create.cwd = optional_string(object, "cwd");
    // chdir takes a NUL-terminated path: an embedded NUL would name another directory.
    if (create.cwd && (create.cwd->empty() || create.cwd->find('\0') != std::string::npos))
        bad_field("cwd", "must be a non-empty path without NUL");
    return create;
}

RestartContextRequest parse_restart_context(const Json& object)
{
    return RestartContextRequest{context_name(require(object, "context"))};
}

RemoveContextRequest parse_remove_context(const Json& object)
{
    return RemoveContextRequest{context_name(require(object, "context"))};
}

} // namespace agentvm
