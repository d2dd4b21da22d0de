// Content digests of snapshot files: equal for equal content however sparse the file, and
// different for any changed byte.
#include <doctest/doctest.h>

#include <ctime>

#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "common/file_digest.hpp"
#include "common/fd.hpp"

using namespace agentvm;

namespace {

Fd temp_file()
{
    Fd fd(::open("/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
    REQUIRE(fd);
    return fd;
}

void put(int fd, uint64_t offset, const std::string& bytes)
{
    REQUIRE(::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset))
            == static_cast<ssize_t>(bytes.size()));
}

} // namespace

TEST_CASE("a sparse file and a dense copy of it have the same digest")
{
    Fd sparse = temp_file();
    put(sparse.get(), 8192, "hello");
    REQUIRE(::ftruncate(sparse.get(), 1 << 20) == 0);

    Fd dense = temp_file();
    put(dense.get(), 0, std::string(1 << 20, '\0'));
    put(dense.get(), 8192, "hello");

    CHECK(content_digest(sparse.get(), "sparse") == content_digest(dense.get(), "dense"));
    CHECK(content_digest(sparse.get(), "sparse").size() == 64);
}

TEST_CASE("any changed byte, a moved byte or another size changes the digest")
{
    Fd file = temp_file();
    put(file.get(), 4096, "abc");
    REQUIRE(::ftruncate(file.get(), 65536) == 0);
    const std::string original = content_digest(file.get(), "f");

    put(file.get(), 4097, "x");  // flipped byte in data
    CHECK(content_digest(file.get(), "f") != original);
    put(file.get(), 4097, "b");
    CHECK(content_digest(file.get(), "f") == original);

    put(file.get(), 40000, "\x01");  // a byte where a hole was
    CHECK(content_digest(file.get(), "f") != original);
    put(file.get(), 40000, std::string(1, '\0'));
    CHECK(content_digest(file.get(), "f") == original);

    REQUIRE(::ftruncate(file.get(), 65536 + 4096) == 0);  // longer, extra zeros
    CHECK(content_digest(file.get(), "f") != original);
}

TEST_CASE("the same bytes at another offset differ")
{
    Fd a = temp_file();
    Fd b = temp_file();
    put(a.get(), 0, "data");
    put(b.get(), 4096, "data");
    REQUIRE(::ftruncate(a.get(), 8192) == 0);
    REQUIRE(::ftruncate(b.get(), 8192) == 0);
    CHECK(content_digest(a.get(), "a") != content_digest(b.get(), "b"));
}

TEST_CASE("a file stamp changes when the file is written")
{
    Fd file = temp_file();
    put(file.get(), 0, "one");
    const FileStamp before = file_stamp(file.get(), "f");
    CHECK(before == file_stamp(file.get(), "f"));
    // The kernel stamps files from the coarse clock: write once it has ticked (a write within
    // one tick, same size, keeps the stamp: the trade SECURITY.md states).
    timespec then{};
    ::clock_gettime(CLOCK_REALTIME_COARSE, &then);
    for (timespec now = then; now.tv_sec == then.tv_sec && now.tv_nsec == then.tv_nsec;)
        ::clock_gettime(CLOCK_REALTIME_COARSE, &now);
    put(file.get(), 0, "two");
    CHECK_FALSE(before == file_stamp(file.get(), "f"));
}

TEST_CASE("bytes read into memory have the digest of the file they were read from")
{
    // A zero page, data, and a partial last page: the cases the file digest treats specially.
    std::string bytes(3 * 4096 + 100, '\0');
    bytes.replace(4096 + 7, 5, "state");
    bytes.replace(3 * 4096 + 50, 3, "end");
    Fd file = temp_file();
    put(file.get(), 0, bytes);
    const auto span = std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    CHECK(content_digest(span) == content_digest(file.get(), "f"));
    CHECK(content_digest(std::span<const uint8_t>()) != content_digest(span));

    bytes[4096 + 7] ^= 1;
    CHECK(content_digest(span) != content_digest(file.get(), "f"));
}
