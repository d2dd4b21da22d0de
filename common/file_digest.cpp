#include "common/file_digest.hpp"

#include <fcntl.h>
#include <nettle/sha2.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/fd.hpp"

namespace agentvm {
namespace {

class Sha256 {
public:
    Sha256() { sha256_init(&ctx_); }
    void update(const void* data, size_t len) { sha256_update(&ctx_, len, static_cast<const uint8_t*>(data)); }
    template <typename T>
    void update_value(T value)
    {
        update(&value, sizeof value);
    }
    std::string hex()
    {
        uint8_t digest[SHA256_DIGEST_SIZE];
        sha256_digest(&ctx_, sizeof digest, digest);
        std::string text;
        for (const uint8_t byte : digest)
            text += fmt::format("{:02x}", byte);
        return text;
    }

private:
    sha256_ctx ctx_{};
};

constexpr uint64_t page = 4096;

// Fixed-size records, (offset, page), so no two contents encode alike; all-zero pages are
// left out, so holes and written-out zeros hash alike. `at` is page-aligned.
void hash_pages(Sha256& sha, uint64_t at, const uint8_t* data, size_t len)
{
    static const uint8_t zeros[page] = {};
    for (size_t p = 0; p < len; p += page) {
        const size_t n = std::min<size_t>(page, len - p);
        if (std::memcmp(data + p, zeros, n) == 0)
            continue;
        sha.update_value(at + p);
        sha.update(data + p, n);
    }
}

} // namespace

std::string sha256_hex(std::span<const uint8_t> bytes)
{
    Sha256 sha;
    sha.update(bytes.data(), bytes.size());
    return sha.hex();
}

std::string sha256_hex(std::string_view text)
{
    Sha256 sha;
    sha.update(text.data(), text.size());
    return sha.hex();
}

std::string content_digest_of(const std::string& path)
{
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        throw_errno(fmt::format("reading '{}'", path));
    Fd owned(fd);
    return content_digest(owned.get(), path);
}

std::string content_digest(int fd, const std::string& name)
{
    constexpr uint64_t chunk = 256 * page;
    const FileStamp stamp = file_stamp(fd, name);
    Sha256 sha;
    std::vector<uint8_t> buffer(chunk);
    uint64_t offset = 0;
    while (offset < stamp.size) {
        const off_t data = ::lseek(fd, static_cast<off_t>(offset), SEEK_DATA);
        if (data < 0 && errno == ENXIO)
            break;
        if (data < 0)
            throw_errno(fmt::format("reading '{}' (SEEK_DATA)", name));
        const off_t hole = ::lseek(fd, data, SEEK_HOLE);
        if (hole < 0)
            throw_errno(fmt::format("reading '{}' (SEEK_HOLE)", name));
        // Extents start and end on page boundaries (or at the end of the file).
        for (uint64_t at = static_cast<uint64_t>(data); at < static_cast<uint64_t>(hole);) {
            const size_t want = static_cast<size_t>(std::min<uint64_t>(static_cast<uint64_t>(hole) - at, chunk));
            const ssize_t n = ::pread(fd, buffer.data(), want, static_cast<off_t>(at));
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                throw_errno(fmt::format("reading '{}'", name), n == 0 ? EIO : errno);
            hash_pages(sha, at, buffer.data(), static_cast<size_t>(n));
            at += static_cast<uint64_t>(n);
        }
        offset = static_cast<uint64_t>(hole);
    }
    sha.update_value(stamp.size);
    return sha.hex();
}

std::string content_digest(std::span<const uint8_t> bytes)
{
    Sha256 sha;
    hash_pages(sha, 0, bytes.data(), bytes.size());
    sha.update_value(uint64_t{bytes.size()});
    return sha.hex();
}

FileStamp file_stamp(int fd, const std::string& name)
{
    struct stat st {};
    if (::fstat(fd, &st) != 0)
        throw_errno(fmt::format("stat '{}'", name));
    return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_size),
            int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec,
            int64_t{st.st_ctim.tv_sec} * 1'000'000'000 + st.st_ctim.tv_nsec};
}

} // namespace agentvm
