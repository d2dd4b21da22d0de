// The OCI config's `User` (or `agentvm template build --user`): "user", "uid", "user:group",
// "uid:gid", "user:gid" or "uid:group", resolved against the image's own /etc/passwd and
// /etc/group, as a container runtime does:
//  - a name must be in /etc/passwd; a numeric uid need not be (then gid 0 and home "/");
//  - a group given is a name in /etc/group or a number, and is the only group (no
//    supplementary ones); without one, the user's passwd gid, and as supplementary groups
//    every /etc/group entry that lists the user's name;
//  - the home directory is the passwd entry's.
#pragma once

#include <string>
#include <string_view>

#include "protocol/image_defaults.hpp"

namespace agentvm {

struct ResolvedUser {
    ImageUser ids;
    std::string home = "/";

    // Root needs no credentials changed (its supplementary groups grant it nothing more).
    bool is_root() const { return ids.uid == 0 && ids.gid == 0; }
};

// `passwd` and `group` are the files' text ("" when the image has none). Throws Error naming
// the user or group the image lacks, or what is malformed in `spec`.
ResolvedUser resolve_image_user(const std::string& spec, std::string_view passwd, std::string_view group);

} // namespace agentvm
