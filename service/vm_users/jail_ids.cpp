#include "service/vm_users/jail_ids.hpp"

#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>

#include <limits>
#include <vector>

#include <fmt/format.h>

#include "common/capabilities.hpp"
#include "common/error.hpp"
#include "common/whole_number.hpp"

namespace agentvm {
namespace {

constexpr uint64_t highest_id = std::numeric_limits<int32_t>::max();

} // namespace

std::optional<JailIdRange> parse_jail_id_range(const std::string& text)
{
    if (text == "none")
        return std::nullopt;
    const std::string_view whole = text;
    const size_t colon = whole.find(':');
    const auto first = colon == whole.npos ? std::nullopt : whole_number<uint32_t>(whole.substr(0, colon));
    const auto count = colon == whole.npos ? std::nullopt : whole_number<uint32_t>(whole.substr(colon + 1));
    if (!first || !count)
        throw Error(fmt::format("--jail-uid-range '{}': give FIRST:COUNT (e.g. {}:{}) or none", text,
                                default_jail_id_range.first, default_jail_id_range.count));
    if (*first == 0 || *count == 0)
        throw Error(fmt::format("--jail-uid-range '{}': the range must not hold 0 (root) and must not be empty", text));
    if (uint64_t{*first} + *count - 1 > highest_id)
        throw Error(fmt::format("--jail-uid-range '{}': the range ends past {}, where some tools take ids as negative",
                                text, highest_id));
    return JailIdRange{*first, *count};
}

void check_no_accounts_in(const JailIdRange& range)
{
    const auto inside = [&](uint64_t id) { return id >= range.first && id - range.first < range.count; };
    std::string found;
    ::setpwent();
    while (const passwd* user = ::getpwent())
        if (found.empty() && inside(user->pw_uid))
            found = fmt::format("user {} (uid {})", user->pw_name, user->pw_uid);
    ::endpwent();
    ::setgrent();
    while (const group* entry = ::getgrent())
        if (found.empty() && inside(entry->gr_gid))
            found = fmt::format("group {} (gid {})", entry->gr_name, entry->gr_gid);
    ::endgrent();
    if (!found.empty())
        throw Error(fmt::format("--jail-uid-range {}:{} holds the host's {}: a VMM would share its files; choose a "
                                "range no account uses",
                                range.first, range.count, found));
}

void check_jail_id_privileges()
{
    const std::vector<std::string> missing = missing_capabilities(
        {{CAP_CHOWN, "CAP_CHOWN"}, {CAP_SETUID, "CAP_SETUID"}, {CAP_SETGID, "CAP_SETGID"}, {CAP_KILL, "CAP_KILL"},
         {CAP_SYS_ADMIN, "CAP_SYS_ADMIN"}, {CAP_SETPCAP, "CAP_SETPCAP"}});
    if (!missing.empty())
        throw Error(fmt::format("--jail-uid-range: running each VMM as a uid of its own needs {}, which root has: run "
                                "serve as root or with the unit's capabilities (deploy/systemd/agentvm-serve.service), "
                                "or give --jail-uid-range none to keep serve's uid for its VMMs",
                                fmt::join(missing, " and ")));
}

std::optional<uint32_t> JailIds::take()
{
    uint32_t id = 0;
    if (never_used_ < range_.count) {
        id = range_.first + never_used_++;
    } else if (!freed_.empty()) {
        id = freed_.front();
        freed_.pop_front();
    } else {
        return std::nullopt;
    }
    ++in_use_;
    return id;
}

void JailIds::give_back(uint32_t id)
{
    freed_.push_back(id);
    --in_use_;
}

} // namespace agentvm
