#include "protocol/image_defaults.hpp"

#include <algorithm>

#include "common/whole_number.hpp"

namespace agentvm {
namespace {

// One id at the front of `text`, up to `end` or the end of the text, consumed.
std::optional<uint32_t> take_id(std::string_view& text, char end)
{
    const size_t length = std::min(text.find(end), text.size());
    const auto id = parse_image_id(text.substr(0, length));
    if (id)
        text.remove_prefix(length);
    return id;
}

bool take(std::string_view& text, char c)
{
    if (text.empty() || text.front() != c)
        return false;
    text.remove_prefix(1);
    return true;
}

} // namespace

std::optional<uint32_t> parse_image_id(std::string_view text)
{
    const std::optional<uint32_t> id = whole_number<uint32_t>(text);
    if (id == UINT32_MAX)
        return std::nullopt;
    return id;
}

std::string format_image_user(const ImageUser& user)
{
    std::string text = std::to_string(user.uid) + ":" + std::to_string(user.gid);
    for (size_t i = 0; i < user.groups.size(); ++i) {
        text += i == 0 ? ':' : ',';
        text += std::to_string(user.groups[i]);
    }
    return text + "\n";
}

std::optional<ImageUser> parse_image_user(std::string_view text)
{
    if (!text.empty() && text.back() == '\n')
        text.remove_suffix(1);
    ImageUser user;
    const auto uid = take_id(text, ':');
    if (!uid || !take(text, ':'))
        return std::nullopt;
    const auto gid = take_id(text, ':');
    if (!gid)
        return std::nullopt;
    user.uid = *uid;
    user.gid = *gid;
    if (text.empty())
        return user;
    if (!take(text, ':'))
        return std::nullopt;
    do {
        const auto group = take_id(text, ',');
        if (!group || user.groups.size() == max_supplementary_groups)
            return std::nullopt;
        user.groups.push_back(*group);
    } while (take(text, ','));
    if (!text.empty())
        return std::nullopt;
    return user;
}

} // namespace agentvm
