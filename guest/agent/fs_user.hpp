// File operations on a user's behalf: stat, list_dir, make_dir, move, remove and watch check
// permissions and create files as the call's user would, not as root, though the agent stays
// root. That user is the one the call names ("user", accounts.hpp), else the image's
// (run_as.hpp); read_file and write_file act so only for a named one.
//
// Only the calling thread changes: its file-system uid and gid and its supplementary groups,
// through the raw system calls (the kernel keeps credentials per thread; glibc's setgroups
// wrapper would change every thread of the agent, among them those starting commands).
// setfsuid to a non-zero uid also drops the thread's file capabilities (CAP_DAC_OVERRIDE,
// CAP_FOWNER, ...), and setting it back to 0 restores them.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "protocol/image_defaults.hpp"

namespace agentvm {

// The user a file call acts as: the one it names (looked up as root, before the switch), else
// the image's; nullopt for root. Throws CallError(bad_field) for a user the guest does not have.
std::optional<ImageUser> file_call_user(const std::optional<std::string>& name);

class UserFiles {
public:
    // Takes on `user`'s credentials on this thread; nothing for nullopt (root). Throws
    // CallError(internal) when the kernel refuses.
    explicit UserFiles(const std::optional<ImageUser>& user);
    // Back to the thread's own credentials.
    ~UserFiles();
    UserFiles(const UserFiles&) = delete;
    UserFiles& operator=(const UserFiles&) = delete;

private:
    void restore() noexcept;

    bool switched_ = false;
    uid_t saved_fsuid_ = 0;
    gid_t saved_fsgid_ = 0;
    std::vector<gid_t> saved_groups_;
};

} // namespace agentvm
