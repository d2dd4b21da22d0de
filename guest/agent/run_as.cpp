#include "guest/agent/run_as.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <type_traits>

#include "common/error.hpp"
#include "guest/read_file.hpp"

namespace agentvm {
namespace {

// Set once by load_run_as() before any call (and any thread but main) exists; read after.
std::optional<ImageUser> loaded;

// setgroups takes the ids as they are kept, with no copy to make in a forked child.
static_assert(std::is_same_v<gid_t, uint32_t>);

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
}

const std::optional<ImageUser>& run_as()
{
    return loaded;
}

int drop_to(const ImageUser& user)
{
    if (::syscall(SYS_setgroups, user.groups.size(), user.groups.data()) != 0)
        return errno;
    if (::syscall(SYS_setresgid, user.gid, user.gid, user.gid) != 0)
        return errno;
    if (::syscall(SYS_setresuid, user.uid, user.uid, user.uid) != 0)
        return errno;
    return 0;
}

int drop_to_run_as()
{
    return loaded ? drop_to(*loaded) : 0;
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
