#include "templates/image_delta.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/fd.hpp"

namespace agentvm {
namespace {

constexpr uint64_t chunk_bytes = 1 << 20;  // compared per read: 256 blocks

using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;

Fd open_file(const std::filesystem::path& path, int flags, const char* what)
{
    Fd fd(::open(path.c_str(), flags | O_CLOEXEC, 0644));
    if (!fd)
        throw_errno(fmt::format("opening {} '{}'", what, path.string()));
    return fd;
}

uint64_t size_of(int fd, const std::filesystem::path& path)
{
    struct stat st {};
    if (::fstat(fd, &st) != 0)
        throw_errno(fmt::format("stat '{}'", path.string()));
    return static_cast<uint64_t>(st.st_size);
}

// The file's data runs as the filesystem reports them (SEEK_DATA/SEEK_HOLE), widened to whole
// blocks: everything else reads as zeros.
Ranges data_runs(int fd, uint64_t size, const std::filesystem::path& path)
{
    Ranges runs;
    off_t at = 0;
    while (static_cast<uint64_t>(at) < size) {
        const off_t data = ::lseek(fd, at, SEEK_DATA);
        if (data < 0 && errno == ENXIO)
            break;
        if (data < 0)
            throw_errno(fmt::format("finding the data in '{}'", path.string()));
        const off_t hole = ::lseek(fd, data, SEEK_HOLE);
        if (hole < 0)
            throw_errno(fmt::format("finding the holes in '{}'", path.string()));
        const uint64_t begin = static_cast<uint64_t>(data) / delta_block_bytes * delta_block_bytes;
        const uint64_t end = std::min(size, (static_cast<uint64_t>(hole) + delta_block_bytes - 1) / delta_block_bytes *
                                                delta_block_bytes);
        runs.emplace_back(begin, end - begin);
        at = hole;
    }
    return runs;
}

// The union of two ordered run lists, ordered and merged.
Ranges union_of(const Ranges& a, const Ranges& b)
{
    Ranges all(a);
    all.insert(all.end(), b.begin(), b.end());
    std::sort(all.begin(), all.end());
    Ranges merged;
    for (const auto& [offset, length] : all) {
        if (!merged.empty() && offset <= merged.back().first + merged.back().second)
            merged.back().second = std::max(merged.back().first + merged.back().second, offset + length) -
                                   merged.back().first;
        else
            merged.emplace_back(offset, length);
    }
    return merged;
}

void read_exact(int fd, char* buffer, uint64_t length, uint64_t offset, const std::filesystem::path& path)
{
    uint64_t done = 0;
    while (done < length) {
        const ssize_t n = ::pread(fd, buffer + done, length - done, static_cast<off_t>(offset + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            throw_errno(fmt::format("reading '{}' at byte {}", path.string(), offset + done), n == 0 ? EIO : errno);
        done += static_cast<uint64_t>(n);
    }
}

void write_exact(int fd, const char* buffer, uint64_t length, uint64_t offset, const std::filesystem::path& path)
{
    uint64_t done = 0;
    while (done < length) {
        const ssize_t n = ::pwrite(fd, buffer + done, length - done, static_cast<off_t>(offset + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            throw_errno(fmt::format("writing '{}' at byte {}", path.string(), offset + done), n == 0 ? EIO : errno);
        done += static_cast<uint64_t>(n);
    }
}

void add_range(Ranges& ranges, uint64_t offset, uint64_t length)
{
    if (!ranges.empty() && ranges.back().first + ranges.back().second == offset)
        ranges.back().second += length;
    else
        ranges.emplace_back(offset, length);
}

} // namespace

ImageDelta write_image_delta(const std::filesystem::path& base, const std::filesystem::path& image,
                             const std::filesystem::path& layer)
{
    const Fd base_fd = open_file(base, O_RDONLY, "the base image");
    const Fd image_fd = open_file(image, O_RDONLY, "the template's image");
    const uint64_t size = size_of(image_fd.get(), image);
    if (size_of(base_fd.get(), base) != size)
        throw Error(fmt::format("the image '{}' ({} bytes) and its base '{}' ({} bytes) differ in size", image.string(),
                                size, base.string(), size_of(base_fd.get(), base)));
    const Fd layer_fd = open_file(layer, O_WRONLY | O_CREAT | O_EXCL, "the template's layer");
    if (::ftruncate(layer_fd.get(), static_cast<off_t>(size)) != 0)
        throw_errno(fmt::format("sizing '{}'", layer.string()));

    ImageDelta delta;
    std::vector<char> from_base(chunk_bytes);
    std::vector<char> from_image(chunk_bytes);
    for (const auto& [offset, length] : union_of(data_runs(base_fd.get(), size, base),
                                                 data_runs(image_fd.get(), size, image))) {
        for (uint64_t at = offset; at < offset + length; at += chunk_bytes) {
            const uint64_t n = std::min(chunk_bytes, offset + length - at);
            read_exact(base_fd.get(), from_base.data(), n, at, base);
            read_exact(image_fd.get(), from_image.data(), n, at, image);
            for (uint64_t block = 0; block < n; block += delta_block_bytes) {
                const uint64_t block_length = std::min(delta_block_bytes, n - block);
                if (std::memcmp(from_base.data() + block, from_image.data() + block, block_length) == 0)
                    continue;
                write_exact(layer_fd.get(), from_image.data() + block, block_length, at + block, layer);
                add_range(delta.byte_ranges, at + block, block_length);
                delta.bytes += block_length;
            }
        }
    }
    if (::fsync(layer_fd.get()) != 0)
        throw_errno(fmt::format("writing '{}' out", layer.string()));
    return delta;
}

void write_ranges_file(const std::filesystem::path& path, const std::vector<std::pair<uint64_t, uint64_t>>& ranges)
{
    nlohmann::json list = nlohmann::json::array();
    for (const auto& [offset, length] : ranges)
        list.push_back({offset, length});
    const std::string text = list.dump() + "\n";
    const auto staged = std::filesystem::path(path.string() + ".new");
    {
        const Fd fd = open_file(staged, O_WRONLY | O_CREAT | O_TRUNC, "the layer's ranges");
        write_exact(fd.get(), text.data(), text.size(), 0, staged);
        if (::fsync(fd.get()) != 0)
            throw_errno(fmt::format("writing '{}' out", staged.string()));
    }
    std::filesystem::rename(staged, path);
}

std::vector<std::pair<uint64_t, uint64_t>> read_ranges_file(const std::filesystem::path& path, uint64_t disk_bytes)
{
    // At most one range per two blocks (ranges are apart), each "[offset,length]," in under 48 bytes.
    const uint64_t max_bytes = (disk_bytes / (2 * delta_block_bytes) + 1) * 48;
    const Fd fd = open_file(path, O_RDONLY, "the template's layer ranges");
    const uint64_t size = size_of(fd.get(), path);
    if (size > max_bytes)
        throw Error(fmt::format("'{}' holds {} bytes, more than ranges over a {}-byte disk can: not what a build wrote",
                                path.string(), size, disk_bytes));
    std::string text(size, '\0');
    read_exact(fd.get(), text.data(), size, 0, path);
    const nlohmann::json list = nlohmann::json::parse(text, nullptr, false);
    const auto malformed = [&](const std::string& why) {
        return Error(fmt::format("'{}' is not what a build wrote ({}): build the template again", path.string(), why));
    };
    if (!list.is_array())
        throw malformed("not a list of [offset, length]");
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    uint64_t end = 0;
    for (const nlohmann::json& range : list) {
        if (!range.is_array() || range.size() != 2 || !range[0].is_number_unsigned() || !range[1].is_number_unsigned())
            throw malformed(fmt::format("{} is not [offset, length]", range.dump()));
        const auto offset = range[0].get<uint64_t>();
        const auto length = range[1].get<uint64_t>();
        if (offset % 512 != 0 || length % 512 != 0 || length == 0)
            throw malformed(fmt::format("{} is not whole sectors", range.dump()));
        if (offset < end || (end != 0 && offset == end))
            throw malformed(fmt::format("{} is out of order or touches the one before", range.dump()));
        if (offset > disk_bytes || length > disk_bytes - offset)
            throw malformed(fmt::format("{} leaves the {}-byte disk", range.dump(), disk_bytes));
        ranges.emplace_back(offset, length);
        end = offset + length;
    }
    return ranges;
}

} // namespace agentvm
