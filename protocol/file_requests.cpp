#include "protocol/file_requests.hpp"

#include "protocol/agent_protocol.hpp"
#include "protocol/request_fields.hpp"

namespace agentvm {

namespace {

// The system calls take C strings: a NUL would silently name another, shorter path.
std::string require_path(const Json& object, const std::string& name)
{
    std::string path = require_string(object, name);
    if (path.empty() || path.find('\0') != std::string::npos)
        bad_field(name, "must be a non-empty path without NUL");
    return path;
}

} // namespace

MakeDirRequest parse_make_dir(const Json& object)
{
    MakeDirRequest make{require_path(object, "path"), std::nullopt, parse_user(object)};
    if (std::optional<std::string> mode = optional_string(object, "mode"))
        make.mode = parse_mode(*mode);
    return make;
}

MoveRequest parse_move(const Json& object)
{
    return MoveRequest{require_path(object, "from"), require_path(object, "to"), parse_user(object)};
}

RemoveRequest parse_remove(const Json& object)
{
    return RemoveRequest{require_path(object, "path"), optional_bool(object, "recursive"), parse_user(object)};
}

WatchRequest parse_watch(const Json& object)
{
    return WatchRequest{require_path(object, "path"), optional_bool(object, "recursive"), parse_user(object)};
}

uint32_t parse_list_depth(const Json& object)
{
    auto depth = object.find("depth");
    if (depth == object.end() || depth->is_null())
        return 1;
    if (!depth->is_number_unsigned() || depth->get<uint64_t>() == 0 || depth->get<uint64_t>() > max_list_depth)
        bad_field("depth", "must be an integer from 1 to " + std::to_string(max_list_depth));
    return depth->get<uint32_t>();
}

} // namespace agentvm
