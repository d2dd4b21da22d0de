// The guest's users and groups as its /etc/passwd and /etc/group give them: the names of
// files' owners (stat, list_dir) and the users a call's "user" names (exec, spawn, the file
// calls). Both files are read afresh by every call that needs them, since the sandbox's own
// useradd changes them, and at most max_account_file_bytes of each, a bound on what a file the
// sandbox rewrote can cost a call. The agent is static, so glibc's NSS (getpwnam) is not there
// to ask; neither would it bound the read.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "protocol/image_defaults.hpp"

namespace agentvm {

inline constexpr size_t max_account_file_bytes = size_t{1} << 20;

// Where passwd and group are read: /etc; another directory only for the host tests (the
// agent's --accounts). Set once at start-up, before any call runs.
void set_accounts_dir(std::string dir);

struct UserAccount {
    std::string name;
    // Its uid and gid, and as supplementary groups its gid and every group that lists it as a
    // member (what login's initgroups gives).
    ImageUser ids;
    std::string home;
};

// The first passwd entry named `name`, as for getpwnam. Throws CallError(bad_field) when there
// is none.
UserAccount find_user(const std::string& name);

// Owner and group names by id, each file read when first asked; an id without a name is given
// as its number. One per call.
class AccountNames {
public:
    std::string owner(uid_t uid) { return name_of(users_, "passwd", uid); }
    std::string group(gid_t gid) { return name_of(groups_, "group", gid); }

private:
    using Names = std::map<uint32_t, std::string>;

    static std::string name_of(std::optional<Names>& names, const char* file, uint32_t id);

    std::optional<Names> users_;
    std::optional<Names> groups_;
};

} // namespace agentvm
