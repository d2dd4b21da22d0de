#include "templates/image_user.hpp"

#include <optional>
#include <vector>

#include <fmt/format.h>

#include "common/error.hpp"

namespace agentvm {
namespace {

std::vector<std::string_view> split(std::string_view text, char separator)
{
    std::vector<std::string_view> parts;
    for (;;) {
        const size_t at = text.find(separator);
        parts.push_back(text.substr(0, at));
        if (at == std::string_view::npos)
            return parts;
        text.remove_prefix(at + 1);
    }
}

// The lines of a colon-separated database with at least `fields` fields; others are skipped,
// as the C library skips them.
std::vector<std::vector<std::string_view>> entries(std::string_view text, size_t fields)
{
    std::vector<std::vector<std::string_view>> found;
    for (std::string_view line : split(text, '\n')) {
        if (line.empty() || line.front() == '#')
            continue;
        std::vector<std::string_view> parts = split(line, ':');
        if (parts.size() >= fields)
            found.push_back(std::move(parts));
    }
    return found;
}

struct PasswdEntry {
    std::string name;
    uint32_t uid = 0;
    uint32_t gid = 0;
    std::string home;
};

std::optional<PasswdEntry> find_user(std::string_view passwd, std::string_view name, std::optional<uint32_t> uid)
{
    for (const auto& fields : entries(passwd, 7)) {
        const auto entry_uid = parse_image_id(fields[2]);
        const auto entry_gid = parse_image_id(fields[3]);
        if (!entry_uid || !entry_gid)
            continue;
        if (uid ? *entry_uid == *uid : fields[0] == name)
            return PasswdEntry{std::string(fields[0]), *entry_uid, *entry_gid, std::string(fields[5])};
    }
    return std::nullopt;
}

} // namespace

ResolvedUser resolve_image_user(const std::string& spec, std::string_view passwd, std::string_view group)
{
    const size_t colon = spec.find(':');
    const std::string_view user_part = std::string_view(spec).substr(0, colon);
    const std::optional<std::string_view> group_part =
        colon == std::string::npos ? std::nullopt : std::optional(std::string_view(spec).substr(colon + 1));
    if (user_part.empty() || (group_part && group_part->empty()))
        throw Error(fmt::format("User '{}': expected USER, UID, USER:GROUP or UID:GID", spec));

    ResolvedUser resolved;
    const std::optional<uint32_t> uid = parse_image_id(user_part);
    const std::optional<PasswdEntry> entry = find_user(passwd, user_part, uid);
    if (!uid && !entry)
        throw Error(fmt::format("User '{}': the image's /etc/passwd has no user '{}'", spec, user_part));
    resolved.ids.uid = entry ? entry->uid : *uid;
    resolved.ids.gid = entry ? entry->gid : 0;
    if (entry && !entry->home.empty())
        resolved.home = entry->home;

    const auto groups = entries(group, 4);
    if (group_part) {
        if (const auto gid = parse_image_id(*group_part)) {
            resolved.ids.gid = *gid;
            return resolved;
        }
        for (const auto& fields : groups) {
            if (fields[0] == *group_part) {
                if (const auto gid = parse_image_id(fields[2])) {
                    resolved.ids.gid = *gid;
                    return resolved;
                }
            }
        }
        throw Error(fmt::format("User '{}': the image's /etc/group has no group '{}'", spec, *group_part));
    }
    if (!entry)
        return resolved;
    for (const auto& fields : groups) {
        const auto gid = parse_image_id(fields[2]);
        if (!gid || resolved.ids.groups.size() == max_supplementary_groups)
            continue;
        for (std::string_view member : split(fields[3], ','))
            if (member == entry->name) {
                resolved.ids.groups.push_back(*gid);
                break;
            }
    }
    return resolved;
}

} // namespace agentvm
