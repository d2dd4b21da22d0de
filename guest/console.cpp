#include "guest/console.hpp"

#include <fcntl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace agentvm {

namespace {

constexpr char prefix[] = "agentvm-init: ";

void write_all(int fd, const char* data, size_t size)
{
    while (size > 0) {
        ssize_t n = ::write(fd, data, size);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return; // Nowhere left to report a broken console.
        data += n;
        size -= static_cast<size_t>(n);
    }
}

void say_va(const char* format, va_list args)
{
    char line[1024];
    size_t used = sizeof(prefix) - 1;
    std::memcpy(line, prefix, used);
    int n = std::vsnprintf(line + used, sizeof(line) - used - 1, format, args);
    if (n > 0)
        used += std::min(static_cast<size_t>(n), sizeof(line) - used - 2);
    line[used++] = '\n';
    write_all(STDOUT_FILENO, line, used);
}

} // namespace

void ensure_console()
{
    if (::fcntl(STDOUT_FILENO, F_GETFD) >= 0)
        return;
    int fd = ::open("/dev/console", O_RDWR | O_NOCTTY);
    if (fd < 0)
        return; // Nothing to print the failure on; the VMM sees a silent guest.
    for (int target = 0; target <= 2; ++target)
        if (fd != target)
            ::dup2(fd, target);
    if (fd > 2)
        ::close(fd);
}

void say(const char* format, ...)
{
    int saved_errno = errno;
    va_list args;
    va_start(args, format);
    say_va(format, args);
    va_end(args);
    errno = saved_errno;
}

void say_errno(const char* what)
{
    say("%s: %s", what, std::strerror(errno));
}

void drain_console()
{
    ::tcdrain(STDOUT_FILENO);
}

} // namespace agentvm
