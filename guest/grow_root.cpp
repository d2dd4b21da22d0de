#include "guest/grow_root.hpp"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "guest/console.hpp"

namespace agentvm {
namespace {

// fs/ext4/ext4.h: the online resize ioctl, which no uapi header exports. It takes the new
// size in filesystem blocks.
constexpr unsigned long ext4_ioc_resize_fs = _IOW('f', 16, uint64_t);

// The size of block device `dev` in 512-byte sectors, from sysfs (no /dev node needed).
bool device_sectors(dev_t dev, uint64_t& sectors)
{
    char path[64];
    std::snprintf(path, sizeof(path), "/sys/dev/block/%u:%u/size", major(dev), minor(dev));
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        say_errno(path);
        return false;
    }
    char text[32] = {};
    const ssize_t n = ::read(fd, text, sizeof(text) - 1);
    ::close(fd);
    char* end = nullptr;
    errno = 0;
    sectors = n > 0 ? std::strtoull(text, &end, 10) : 0;
    if (n <= 0 || errno != 0 || end == text) {
        say("cannot read the root disk's size from %s", path);
        return false;
    }
    return true;
}

} // namespace

void grow_root_filesystem()
{
    const int root = ::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (root < 0) {
        say_errno("open /");
        return;
    }
    struct stat st {};
    struct statfs fs {};
    uint64_t sectors = 0;
    if (::fstat(root, &st) != 0 || ::fstatfs(root, &fs) != 0) {
        say_errno("stat /");
    } else if (device_sectors(st.st_dev, sectors)) {
        uint64_t blocks = sectors * 512 / static_cast<uint64_t>(fs.f_bsize);
        if (::ioctl(root, ext4_ioc_resize_fs, &blocks) != 0)
            say_errno("growing the root filesystem to its disk");
        else
            say("root filesystem grown to %" PRIu64 " MiB", sectors / 2048);
    }
    ::close(root);
}

} // namespace agentvm
