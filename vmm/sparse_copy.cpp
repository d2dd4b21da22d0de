#include "vmm/sparse_copy.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include <fmt/format.h>

#include "vmm/error.hpp"

namespace agentvm {
namespace {

// [begin, end) of `from` to the same offsets of `to`: in the kernel where it can (same
// filesystem), else through a buffer.
uint64_t copy_range(int from, int to, off_t begin, off_t end, const std::string& what)
{
    off_t in = begin;
    off_t out = begin;
    while (in < end) {
        const ssize_t n = ::copy_file_range(from, &in, to, &out, static_cast<size_t>(end - in), 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP))
            break;
        if (n <= 0)
            throw_errno(fmt::format("copying {}", what), n == 0 ? EIO : errno);
    }
    std::vector<char> buffer(1 << 20);
    while (in < end) {
        const ssize_t n = ::pread(from, buffer.data(), std::min<size_t>(buffer.size(), static_cast<size_t>(end - in)), in);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            throw_errno(fmt::format("copying {}: read", what), n == 0 ? EIO : errno);
        for (ssize_t done = 0; done < n;) {
            const ssize_t w = ::pwrite(to, buffer.data() + done, static_cast<size_t>(n - done), in + done);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                throw_errno(fmt::format("copying {}: write", what), w == 0 ? EIO : errno);
            done += w;
        }
        in += n;
    }
    return static_cast<uint64_t>(end - begin);
}

} // namespace

uint64_t copy_data_extents(int from, int to, const std::string& what)
{
    struct stat st {};
    if (::fstat(from, &st) != 0)
        throw_errno(fmt::format("copying {}: stat", what));
    uint64_t copied = 0;
    off_t offset = 0;
    while (offset < st.st_size) {
        off_t data = ::lseek(from, offset, SEEK_DATA);
        if (data < 0 && errno == ENXIO)
            break;
        if (data < 0)
            throw_errno(fmt::format("copying {}: SEEK_DATA", what));
        const off_t hole = ::lseek(from, data, SEEK_HOLE);
        if (hole < 0)
            throw_errno(fmt::format("copying {}: SEEK_HOLE", what));
        copied += copy_range(from, to, data, hole, what);
        offset = hole;
    }
    if (::ftruncate(to, st.st_size) != 0)
        throw_errno(fmt::format("copying {}: sizing the copy", what));
    return copied;
}

} // namespace agentvm
