#include "common/sparse_copy.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include <fmt/format.h>

#include "common/error.hpp"

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

uint64_t copy_ranges(int from, int to, const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
                     uint64_t size, const std::string& what)
{
    uint64_t copied = 0;
    for (const auto& [offset, length] : ranges)
        copied += copy_range(from, to, static_cast<off_t>(offset), static_cast<off_t>(offset + length), what);
    if (::ftruncate(to, static_cast<off_t>(size)) != 0)
        throw_errno(fmt::format("copying {}: sizing the copy", what));
    return copied;
}

} // namespace agentvm
