#include "guest/agent/fs_user.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "guest/agent/accounts.hpp"
#include "guest/agent/run_as.hpp"
#include "protocol/agent_protocol.hpp"

namespace agentvm {

namespace {

// setfsuid and setfsgid answer the previous id and never fail visibly: an invalid id (-1)
// changes nothing, so it reads the current one back.
constexpr long query_id = -1;

long fsuid_now()
{
    return ::syscall(SYS_setfsuid, query_id);
}

long fsgid_now()
{
    return ::syscall(SYS_setfsgid, query_id);
}

[[noreturn]] void refuse(const char* step)
{
    throw CallError("internal", std::string("taking on the user's file credentials: ") + step + ": "
                                    + std::strerror(errno));
}

} // namespace

std::optional<ImageUser> file_call_user(const std::optional<std::string>& name)
{
    if (name)
        return find_user(*name).ids;
    return run_as();
}

UserFiles::UserFiles(const std::optional<ImageUser>& user)
{
    if (!user)
        return;
    const long count = ::syscall(SYS_getgroups, 0, nullptr);
    if (count < 0)
        refuse("getgroups");
    saved_groups_.resize(static_cast<size_t>(count));
    if (::syscall(SYS_getgroups, count, saved_groups_.data()) != count)
        refuse("getgroups");
    saved_fsuid_ = static_cast<uid_t>(fsuid_now());
    saved_fsgid_ = static_cast<gid_t>(fsgid_now());

    // Groups, gid, then uid: a failure part way leaves only what restore() undoes.
    if (::syscall(SYS_setgroups, user->groups.size(), user->groups.data()) != 0)
        refuse("setgroups");
    switched_ = true;
    ::syscall(SYS_setfsgid, user->gid);
    if (fsgid_now() != static_cast<long>(user->gid)) {
        restore();
        errno = EPERM;
        refuse("setfsgid");
    }
    ::syscall(SYS_setfsuid, user->uid);
    if (fsuid_now() != static_cast<long>(user->uid)) {
        restore();
        errno = EPERM;
        refuse("setfsuid");
    }
}

UserFiles::~UserFiles()
{
    if (switched_)
        restore();
}

void UserFiles::restore() noexcept
{
    // The uid first: back to root it brings the file capabilities back.
    ::syscall(SYS_setfsuid, saved_fsuid_);
    ::syscall(SYS_setfsgid, saved_fsgid_);
    const bool groups_back = ::syscall(SYS_setgroups, saved_groups_.size(), saved_groups_.data()) == 0;
    if (fsuid_now() != static_cast<long>(saved_fsuid_) || fsgid_now() != static_cast<long>(saved_fsgid_)
        || !groups_back) {
        // This thread would go on serving root's operations (write_file, read_file) with the
        // user's rights: stop rather than answer wrongly. Root (CAP_SETUID, CAP_SETGID kept
        // throughout) is always allowed these calls, so this does not happen.
        std::fprintf(stderr, "agentvm-agent: could not restore the file credentials of a thread\n");
        std::abort();
    }
}

} // namespace agentvm
