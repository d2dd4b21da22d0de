#include "guest/agent/accounts.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <functional>
#include <string_view>
#include <vector>

#include "common/fd.hpp"
#include "protocol/agent_protocol.hpp"
#include "protocol/utf8.hpp"

namespace agentvm {

namespace {

// Written once by set_accounts_dir() before any call runs; only read after.
std::string accounts_dir = "/etc";

// Up to max_account_file_bytes of DIR/file; empty when it cannot be read.
std::string read_account_file(const char* file)
{
    std::string text;
    Fd fd(::open((accounts_dir + "/" + file).c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd)
        return text;
    text.resize(max_account_file_bytes);
    size_t filled = 0;
    while (filled < text.size()) {
        const ssize_t n = ::read(fd.get(), text.data() + filled, text.size() - filled);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        filled += static_cast<size_t>(n);
    }
    text.resize(filled);
    // A line cut by the bound is not a line.
    if (filled == max_account_file_bytes)
        text.resize(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1);
    return text;
}

// Splits `line` at ':' into at most `count` fields; fewer when the line has fewer.
std::vector<std::string_view> fields_of(std::string_view line, size_t count)
{
    std::vector<std::string_view> fields;
    while (fields.size() + 1 < count) {
        const size_t colon = line.find(':');
        if (colon == std::string_view::npos)
            break;
        fields.push_back(line.substr(0, colon));
        line.remove_prefix(colon + 1);
    }
    fields.push_back(line);
    return fields;
}

// Calls `take` with the fields of each line of `file` (passwd or group), until it returns false.
void for_each_entry(const char* file, size_t count,
                    const std::function<bool(const std::vector<std::string_view>&)>& take)
{
    const std::string text = read_account_file(file);
    for (size_t start = 0; start < text.size();) {
        const size_t end = std::min(text.find('\n', start), text.size());
        const std::string_view line(text.data() + start, end - start);
        start = end + 1;
        if (!line.empty() && !take(fields_of(line, count)))
            return;
    }
}

} // namespace

void set_accounts_dir(std::string dir)
{
    accounts_dir = std::move(dir);
}

UserAccount find_user(const std::string& name)
{
    std::optional<UserAccount> found;
    // name:password:uid:gid:gecos:home:shell
    for_each_entry("passwd", 7, [&](const std::vector<std::string_view>& entry) {
        if (entry.size() < 6 || entry[0] != name)
            return true;
        const std::optional<uint32_t> uid = parse_image_id(entry[2]);
        const std::optional<uint32_t> gid = parse_image_id(entry[3]);
        // A broken entry is no user, as for getpwnam, which stops at the first of that name.
        if (uid && gid)
            found = UserAccount{name, ImageUser{*uid, *gid, {*gid}}, std::string(entry[5])};
        return false;
    });
    if (!found)
        throw CallError("bad_field", "no user \"" + name + "\" in the guest's /etc/passwd");
    std::vector<uint32_t>& groups = found->ids.groups;
    // name:password:gid:member,member,...
    for_each_entry("group", 4, [&](const std::vector<std::string_view>& entry) {
        if (entry.size() < 4)
            return true;
        const std::optional<uint32_t> gid = parse_image_id(entry[2]);
        if (!gid || std::find(groups.begin(), groups.end(), *gid) != groups.end())
            return true;
        for (std::string_view members = entry[3]; !members.empty();) {
            const size_t comma = std::min(members.find(','), members.size());
            if (members.substr(0, comma) == name) {
                groups.push_back(*gid);
                break;
            }
            members.remove_prefix(std::min(comma + 1, members.size()));
        }
        return groups.size() < max_supplementary_groups;
    });
    return *found;
}

std::string AccountNames::name_of(std::optional<Names>& names, const char* file, uint32_t id)
{
    if (!names) {
        names.emplace();
        // name:password:id:...; the first line naming an id wins, as for getpwuid.
        for_each_entry(file, 4, [&](const std::vector<std::string_view>& entry) {
            if (entry.size() < 3 || entry[0].empty() || !is_valid_utf8(entry[0]))
                return true;
            if (const std::optional<uint32_t> number = parse_image_id(entry[2]))
                names->emplace(*number, entry[0]);
            return true;
        });
    }
    const auto it = names->find(id);
    return it != names->end() ? it->second : std::to_string(id);
}

} // namespace agentvm
