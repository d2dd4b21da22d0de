#include "guest/read_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace agentvm {

std::optional<std::string> read_small_file(const char* path, size_t max_bytes)
{
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return std::nullopt;
    std::string text;
    char buffer[4096];
    for (;;) {
        const ssize_t n = ::read(fd, buffer, sizeof(buffer));
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0)
            break;
        const int err = n < 0 ? errno : EFBIG;
        if (n < 0 || text.size() + static_cast<size_t>(n) > max_bytes) {
            ::close(fd);
            errno = err;
            return std::nullopt;
        }
        text.append(buffer, static_cast<size_t>(n));
    }
    ::close(fd);
    return text;
}

} // namespace agentvm
