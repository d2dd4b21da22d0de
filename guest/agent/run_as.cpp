#include "guest/agent/run_as.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.hpp"
#include "guest/read_file.hpp"

namespace agentvm {
namespace {

// Set once by load_run_as() before any call (and any thread but main) exists; read after.
std::optional<ImageUser> loaded;
// The supplementary groups in the kernel's type, ready before any fork.
std::vector<gid_t> loaded_groups;

} // namespace

void load_run_as(const char* path)
{
    const std::optional<std::string> text = read_small_file(path, max_image_defaults_bytes);
    if (!text) {
        if (errno == ENOENT)
            return;
        throw Error(std::string(path) + ": " + std::strerror(errno));
    }
    loaded = parse_image_user(*text);
    if (!loaded)
        throw Error(std::string(path) + ": not UID:GID[:GROUP,...]");
    loaded_groups.assign(loaded->groups.begin(), loaded->groups.end());
}

const std::optional<ImageUser>& run_as()
{
    return loaded;
}

int drop_to_run_as()
{
    if (!loaded)
        return 0;
    if (::syscall(SYS_setgroups, loaded_groups.size(), loaded_groups.data()) != 0)
        return errno;
    if (::syscall(SYS_setresgid, loaded->gid, loaded->gid, loaded->gid) != 0)
        return errno;
    if (::syscall(SYS_setresuid, loaded->uid, loaded->uid, loaded->uid) != 0)
        return errno;
    return 0;
}

int hand_over(int fd)
{
    if (!loaded)
        return 0;
    return ::fchown(fd, loaded->uid, loaded->gid) == 0 ? 0 : errno;
}

int hand_over(const std::string& path)
{
    if (!loaded)
        return 0;
    return ::lchown(path.c_str(), loaded->uid, loaded->gid) == 0 ? 0 : errno;
}

} // namespace agentvm
