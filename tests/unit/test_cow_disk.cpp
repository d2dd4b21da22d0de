#include <doctest/doctest.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "devices/cow_disk.hpp"
#include "tests/support/disk_image.hpp"
#include "core/event_loop.hpp"

using namespace agentvm;
using namespace agentvm::test;

namespace {

constexpr uint64_t sectors = 100;  // not a multiple of 64: exercises the bitmap's tail

struct Fixture {
    TempDir dir;
    TempDir overlay_dir;
    std::string base_path = dir.path + "/base.img";
    std::vector<uint8_t> base_bytes;

    Fixture()
    {
        for (uint64_t s = 0; s < sectors; ++s) {
            auto v = base_sector(s);
            base_bytes.insert(base_bytes.end(), v.begin(), v.end());
        }
        write_bytes(base_path, base_bytes);
    }
};

// Runs one async disk operation to completion and returns its result.
template <typename Op>
int32_t run(EventLoop& loop, Op op)
{
    int32_t result = 1;
    bool done = false;
    op([&](int32_t res) {
        result = res;
        done = true;
    });
    loop.drain();
    REQUIRE(done);
    return result;
}

} // namespace

TEST_CASE("base image errors are clear")
{
    TempDir dir;
    CHECK_THROWS_AS(CowDisk(dir.path + "/missing.img", dir.path), Error);
    write_bytes(dir.path + "/odd.img", std::vector<uint8_t>(1000));
    CHECK_THROWS_WITH_AS(CowDisk(dir.path + "/odd.img", dir.path), doctest::Contains("multiple of 512"), Error);
    write_bytes(dir.path + "/empty.img", {});
    CHECK_THROWS_AS(CowDisk(dir.path + "/empty.img", dir.path), Error);
    CHECK_THROWS_AS(CowDisk(dir.path, dir.path), Error);  // a directory
    write_bytes(dir.path + "/ok.img", std::vector<uint8_t>(1024));
    CHECK_THROWS_AS(CowDisk(dir.path + "/ok.img", dir.path + "/no-such-dir"), Error);
    if (::geteuid() != 0) {
        ::chmod((dir.path + "/ok.img").c_str(), 0);
        CHECK_THROWS_AS(CowDisk(dir.path + "/ok.img", dir.path), Error);
    }
}

TEST_CASE_FIXTURE(Fixture, "the overlay is anonymous, sparse and as large as the base")
{
    CowDisk disk(base_path, overlay_dir.path);
    CHECK(disk.capacity_sectors() == sectors);
    CHECK(overlay_dir.entries() == 0);  // no name, so nothing to clean up after a crash
    struct stat st {};
    REQUIRE(::fstat(disk.overlay_fd(), &st) == 0);
    CHECK(static_cast<uint64_t>(st.st_size) == sectors * 512);
    CHECK(st.st_nlink == 0);
    // The base is open read-only.
    CHECK((::fcntl(disk.base_fd(), F_GETFL) & O_ACCMODE) == O_RDONLY);
}

TEST_CASE_FIXTURE(Fixture, "an fd from the caller is accepted")
{
    Fd fd(::open(base_path.c_str(), O_RDONLY | O_CLOEXEC));
    REQUIRE(fd);
    CowDisk disk(std::move(fd), "base", overlay_dir.path);
    CHECK(disk.capacity_sectors() == sectors);
    CHECK_THROWS_AS(CowDisk(Fd(), "none", overlay_dir.path), Error);
}

TEST_CASE_FIXTURE(Fixture, "read planning splits runs between base and overlay")
{
    CowDisk disk(base_path, overlay_dir.path);
    using E = CowDisk::Extent;
    constexpr auto B = CowDisk::Source::base;
    constexpr auto O = CowDisk::Source::overlay;
    CHECK(disk.plan_read(0, sectors) == std::vector<E>{{0, sectors, B}});
    CHECK(disk.plan_read(5, 0).empty());

    disk.mark_written(3, 2);
    disk.mark_written(63, 3);  // across a bitmap word
    disk.mark_written(99, 1);  // the last sector
    CHECK(disk.is_written(3));
    CHECK(disk.is_written(4));
    CHECK_FALSE(disk.is_written(5));
    CHECK(disk.plan_read(0, 8) == std::vector<E>{{0, 3, B}, {3, 2, O}, {5, 3, B}});
    CHECK(disk.plan_read(4, 1) == std::vector<E>{{4, 1, O}});
    CHECK(disk.plan_read(60, 10) == std::vector<E>{{60, 3, B}, {63, 3, O}, {66, 4, B}});
    CHECK(disk.plan_read(98, 2) == std::vector<E>{{98, 1, B}, {99, 1, O}});
    using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;
    CHECK(disk.overlay_byte_ranges() == Ranges{{3 * 512, 2 * 512}, {63 * 512, 3 * 512}, {99 * 512, 512}});

    CHECK(disk.in_range(0, sectors));
    CHECK(disk.in_range(sectors, 0));
    CHECK_FALSE(disk.in_range(sectors, 1));
    CHECK_FALSE(disk.in_range(1, sectors));
    CHECK_FALSE(disk.in_range(~0ull, 2));  // sector + count overflows
    CHECK_FALSE(disk.in_range(2, ~0ull));
    CHECK_THROWS_AS(disk.plan_read(99, 2), GuestError);
    CHECK_THROWS_AS(disk.plan_read(~0ull, 2), GuestError);
    CHECK_THROWS_AS(disk.mark_written(sectors, 1), GuestError);
    CHECK_THROWS_AS(disk.mark_written(1, ~0ull), GuestError);
    CHECK_FALSE(disk.is_written(sectors));
}

TEST_CASE("slice_iovecs")
{
    uint8_t a[10], b[20], c[30];
    const std::vector<iovec> iov{{a, 10}, {b, 20}, {c, 30}};
    auto s = slice_iovecs(iov, 5, 30);
    REQUIRE(s.size() == 3);
    CHECK(s[0].iov_base == a + 5);
    CHECK(s[0].iov_len == 5);
    CHECK(s[1].iov_base == b);
    CHECK(s[1].iov_len == 20);
    CHECK(s[2].iov_base == c);
    CHECK(s[2].iov_len == 5);
    s = slice_iovecs(iov, 30, 30);
    REQUIRE(s.size() == 1);
    CHECK(s[0].iov_base == c);
    CHECK(s[0].iov_len == 30);
    CHECK(slice_iovecs(iov, 60, 0).empty());
    CHECK_THROWS_AS(slice_iovecs(iov, 50, 11), std::out_of_range);
}

TEST_CASE_FIXTURE(Fixture, "copy-on-write through the event loop")
{
    EventLoop loop;
    CowDisk disk(base_path, overlay_dir.path);

    // Unwritten sectors come from the base.
    std::vector<uint8_t> buf(4 * 512);
    iovec one{buf.data(), buf.size()};
    CHECK(run(loop, [&](auto done) { disk.read(loop, 10, {&one, 1}, done); }) == 4 * 512);
    for (uint64_t s = 0; s < 4; ++s)
        CHECK(std::vector<uint8_t>(buf.begin() + s * 512, buf.begin() + (s + 1) * 512) == base_sector(10 + s));

    // Write sectors 11 and 12 from two buffers.
    std::vector<uint8_t> w1(512, 0xaa), w2(512, 0xbb);
    iovec wv[2] = {{w1.data(), 512}, {w2.data(), 512}};
    CHECK(run(loop, [&](auto done) { disk.write(loop, 11, wv, done); }) == 1024);
    CHECK(disk.is_written(11));
    CHECK(disk.is_written(12));
    CHECK_FALSE(disk.is_written(10));

    // A read across the boundary, into oddly split buffers, stitches base and overlay.
    std::vector<uint8_t> r(4 * 512, 0);
    iovec rv[3] = {{r.data(), 700}, {r.data() + 700, 1000}, {r.data() + 1700, 4 * 512 - 1700}};
    CHECK(run(loop, [&](auto done) { disk.read(loop, 10, rv, done); }) == 4 * 512);
    CHECK(std::vector<uint8_t>(r.begin(), r.begin() + 512) == base_sector(10));
    CHECK(std::vector<uint8_t>(r.begin() + 512, r.begin() + 1024) == w1);
    CHECK(std::vector<uint8_t>(r.begin() + 1024, r.begin() + 1536) == w2);
    CHECK(std::vector<uint8_t>(r.begin() + 1536, r.end()) == base_sector(13));

    // Overwrite again: the newest data wins.
    std::vector<uint8_t> w3(512, 0xcc);
    iovec w3v{w3.data(), 512};
    CHECK(run(loop, [&](auto done) { disk.write(loop, 12, {&w3v, 1}, done); }) == 512);
    iovec r2{r.data(), 512};
    CHECK(run(loop, [&](auto done) { disk.read(loop, 12, {&r2, 1}, done); }) == 512);
    CHECK(std::vector<uint8_t>(r.begin(), r.begin() + 512) == w3);

    // The base file never changed.
    CHECK(read_bytes(base_path) == base_bytes);
    CHECK(overlay_dir.entries() == 0);
}

TEST_CASE_FIXTURE(Fixture, "a disk larger than its base reads zeros past the base until written")
{
    EventLoop loop;
    constexpr uint64_t capacity = sectors + 28;
    CowDisk disk(base_path, overlay_dir.path, capacity * 512);
    CHECK(disk.capacity_sectors() == capacity);
    CHECK(disk.base_sectors() == sectors);
    struct stat st {};
    REQUIRE(::fstat(disk.overlay_fd(), &st) == 0);
    CHECK(static_cast<uint64_t>(st.st_size) == capacity * 512);
    using E = CowDisk::Extent;
    constexpr auto B = CowDisk::Source::base;
    constexpr auto O = CowDisk::Source::overlay;
    CHECK(disk.plan_read(98, 4) == std::vector<E>{{98, 2, B}, {100, 2, O}});
    CHECK_FALSE(disk.is_written(100));

    // Across the base's end: the base's last sector, then zeros.
    std::vector<uint8_t> buf(2 * 512, 0xee);
    iovec whole{buf.data(), buf.size()};
    CHECK(run(loop, [&](auto done) { disk.read(loop, sectors - 1, {&whole, 1}, done); }) == 1024);
    CHECK(std::vector<uint8_t>(buf.begin(), buf.begin() + 512) == base_sector(sectors - 1));
    CHECK(std::vector<uint8_t>(buf.begin() + 512, buf.end()) == std::vector<uint8_t>(512, 0));

    // The last sector of the disk takes a write and gives it back; the bitmap records it.
    std::vector<uint8_t> w(512, 0x5a);
    iovec wv{w.data(), 512};
    CHECK(run(loop, [&](auto done) { disk.write(loop, capacity - 1, {&wv, 1}, done); }) == 512);
    CHECK(disk.is_written(capacity - 1));
    std::vector<uint8_t> r(512);
    iovec rv{r.data(), 512};
    CHECK(run(loop, [&](auto done) { disk.read(loop, capacity - 1, {&rv, 1}, done); }) == 512);
    CHECK(r == w);
    CHECK_THROWS_AS(disk.plan_read(capacity - 1, 2), GuestError);
    CHECK(read_bytes(base_path) == base_bytes);

    // The state carries the capacity: a disk of the base's size does not take it.
    CowDisk same(base_path, overlay_dir.path, capacity * 512);
    same.restore(disk.save(), Fd(::dup(disk.overlay_fd())));
    CHECK(same.save() == disk.save());
    CowDisk smaller(base_path, overlay_dir.path);
    CHECK_THROWS_AS(smaller.restore(disk.save(), Fd(::dup(disk.overlay_fd()))), Error);
}

TEST_CASE_FIXTURE(Fixture, "a disk cannot be smaller than its base or a partial sector")
{
    CHECK_THROWS_WITH_AS(CowDisk(base_path, overlay_dir.path, (sectors - 1) * 512),
                         doctest::Contains("cannot hold its image"), Error);
    CHECK_THROWS_AS(CowDisk(base_path, overlay_dir.path, sectors * 512 + 100), Error);
    CHECK(CowDisk(base_path, overlay_dir.path, sectors * 512).capacity_sectors() == sectors);
}

TEST_CASE_FIXTURE(Fixture, "bad requests are refused before any I/O")
{
    EventLoop loop;
    CowDisk disk(base_path, overlay_dir.path);
    std::vector<uint8_t> buf(1024);
    iovec odd{buf.data(), 700};
    iovec two{buf.data(), 1024};
    auto never = [](int32_t) { FAIL("completion ran for a refused request"); };
    CHECK_THROWS_AS(disk.read(loop, 0, {&odd, 1}, never), GuestError);
    CHECK_THROWS_AS(disk.write(loop, 0, {&odd, 1}, never), GuestError);
    CHECK_THROWS_AS(disk.read(loop, sectors - 1, {&two, 1}, never), GuestError);
    CHECK_THROWS_AS(disk.write(loop, sectors - 1, {&two, 1}, never), GuestError);
    CHECK_THROWS_AS(disk.write(loop, ~0ull, {&two, 1}, never), GuestError);
    CHECK(loop.in_flight() == 0);
    CHECK_FALSE(disk.is_written(sectors - 1));
    // The last sectors themselves are fine.
    CHECK(run(loop, [&](auto done) { disk.write(loop, sectors - 2, {&two, 1}, done); }) == 1024);
    CHECK(read_bytes(base_path) == base_bytes);
}

TEST_CASE_FIXTURE(Fixture, "save, restore, save is identical")
{
    CowDisk disk(base_path, overlay_dir.path);
    disk.mark_written(0, 1);
    disk.mark_written(64, 36);
    const auto s = disk.save();
    CHECK(s.capacity_sectors == sectors);
    REQUIRE(s.written.size() == 2);
    CHECK(s.written[0] == 1);

    CowDisk other(base_path, overlay_dir.path);
    other.restore(s, Fd(::dup(disk.overlay_fd())));
    CHECK(other.save() == s);
    CHECK(other.plan_read(0, 2) == std::vector<CowDisk::Extent>{{0, 1, CowDisk::Source::layer}, {1, 1, CowDisk::Source::base}});

    auto bad = s;
    SUBCASE("wrong capacity") { bad.capacity_sectors = 128; }
    SUBCASE("wrong bitmap size") { bad.written.push_back(0); }
    SUBCASE("bits beyond the end") { bad.written[1] |= 1ull << 40; }
    CowDisk third(base_path, overlay_dir.path);
    CHECK_THROWS_AS(third.restore(bad, Fd(::dup(disk.overlay_fd()))), Error);
    CHECK(third.save() == CowDisk(base_path, overlay_dir.path).save());
}

TEST_CASE_FIXTURE(Fixture, "a restored disk reads the snapshot's sectors from its layer, and writes only its overlay")
{
    EventLoop loop;
    using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;
    // The snapshotted disk: sectors 2-3 and 70 written.
    CowDisk first(base_path, overlay_dir.path);
    std::vector<uint8_t> a(2 * 512, 0xa1);
    iovec av{a.data(), a.size()};
    REQUIRE(run(loop, [&](auto done) { first.write(loop, 2, {&av, 1}, done); }) == 1024);
    std::vector<uint8_t> b(512, 0xb2);
    iovec bv{b.data(), b.size()};
    REQUIRE(run(loop, [&](auto done) { first.write(loop, 70, {&bv, 1}, done); }) == 512);
    const CowDisk::State state = first.save();
    // What a snapshot keeps: the written sectors in a file of their own.
    const std::string snapshot_disk = dir.path + "/snapshot-disk";
    std::vector<uint8_t> file(sectors * 512, 0);
    std::copy(a.begin(), a.end(), file.begin() + 2 * 512);
    std::copy(b.begin(), b.end(), file.begin() + 70 * 512);
    write_bytes(snapshot_disk, file);
    const auto layer = [&] { return Fd(::open(snapshot_disk.c_str(), O_RDONLY | O_CLOEXEC)); };

    CowDisk clone(base_path, overlay_dir.path);
    clone.restore(state, layer());
    using E = CowDisk::Extent;
    constexpr auto B = CowDisk::Source::base;
    constexpr auto L = CowDisk::Source::layer;
    constexpr auto O = CowDisk::Source::overlay;
    CHECK(clone.plan_read(0, 6) == std::vector<E>{{0, 2, B}, {2, 2, L}, {4, 2, B}});
    CHECK(clone.is_written(70));
    CHECK(clone.overlay_byte_ranges().empty());
    CHECK(clone.layer_byte_ranges(0) == Ranges{{2 * 512, 2 * 512}, {70 * 512, 512}});
    std::vector<uint8_t> r(4 * 512);
    iovec rv{r.data(), r.size()};
    REQUIRE(run(loop, [&](auto done) { clone.read(loop, 1, {&rv, 1}, done); }) == 2048);
    CHECK(std::vector<uint8_t>(r.begin(), r.begin() + 512) == base_sector(1));
    CHECK(std::vector<uint8_t>(r.begin() + 512, r.begin() + 1536) == a);
    CHECK(std::vector<uint8_t>(r.begin() + 1536, r.end()) == base_sector(4));

    // The clone overwrites sector 3 of the layer and writes sector 10: its overlay has them.
    std::vector<uint8_t> c(512, 0xc3);
    iovec cv{c.data(), c.size()};
    REQUIRE(run(loop, [&](auto done) { clone.write(loop, 3, {&cv, 1}, done); }) == 512);
    REQUIRE(run(loop, [&](auto done) { clone.write(loop, 10, {&cv, 1}, done); }) == 512);
    CHECK(clone.plan_read(2, 2) == std::vector<E>{{2, 1, L}, {3, 1, O}});
    REQUIRE(run(loop, [&](auto done) { clone.read(loop, 2, {&av, 1}, done); }) == 1024);
    CHECK(std::vector<uint8_t>(a.begin(), a.begin() + 512) == std::vector<uint8_t>(512, 0xa1));
    CHECK(std::vector<uint8_t>(a.begin() + 512, a.end()) == c);
    CHECK(clone.overlay_byte_ranges() == Ranges{{3 * 512, 512}, {10 * 512, 512}});
    CHECK(clone.layer_byte_ranges(0) == Ranges{{2 * 512, 512}, {70 * 512, 512}});
    // Its state is everything it holds, whichever file holds it.
    const CowDisk::State saved = clone.save();
    CHECK(saved.written[0] == ((1ull << 2) | (1ull << 3) | (1ull << 10)));
    CHECK(saved.written[1] == (1ull << 6));
    // The snapshot's file and the base are as they were.
    CHECK(read_bytes(snapshot_disk) == file);
    CHECK(read_bytes(base_path) == base_bytes);

    // One layer, on a fresh disk only.
    CHECK_THROWS_WITH_AS(clone.restore(state, layer()), doctest::Contains("fresh disk"), Error);
    CowDisk written(base_path, overlay_dir.path);
    written.mark_written(0, 1);
    CHECK_THROWS_AS(written.restore(state, layer()), Error);
    CowDisk no_file(base_path, overlay_dir.path);
    CHECK_THROWS_WITH_AS(no_file.restore(state, Fd()), doctest::Contains("no file"), Error);
}

TEST_CASE_FIXTURE(Fixture, "a template's layer: its ranges read from the layer file, the rest from the base")
{
    EventLoop loop;
    using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;
    // The layer file: sectors 4-5 and 99 (the last) are the template's own.
    const std::string layer_path = dir.path + "/rootfs.layer";
    std::vector<uint8_t> file(sectors * 512, 0);
    std::fill(file.begin() + 4 * 512, file.begin() + 6 * 512, 0x4d);
    std::fill(file.begin() + 99 * 512, file.end(), 0x99);
    write_bytes(layer_path, file);
    const auto layer = [&] { return Fd(::open(layer_path.c_str(), O_RDONLY | O_CLOEXEC)); };
    const Ranges ranges{{4 * 512, 2 * 512}, {99 * 512, 512}};

    CowDisk disk(base_path, overlay_dir.path);
    disk.add_layer(layer(), ranges);
    using E = CowDisk::Extent;
    CHECK(disk.plan_read(3, 4) == std::vector<E>{{3, 1, CowDisk::Source::base}, {4, 2, CowDisk::Source::layer},
                                                 {6, 1, CowDisk::Source::base}});
    CHECK(disk.layer_byte_ranges(0) == ranges);
    std::vector<uint8_t> r(512);
    iovec rv{r.data(), r.size()};
    REQUIRE(run(loop, [&](auto done) { disk.read(loop, 99, {&rv, 1}, done); }) == 512);
    CHECK(r == std::vector<uint8_t>(512, 0x99));
    REQUIRE(run(loop, [&](auto done) { disk.read(loop, 98, {&rv, 1}, done); }) == 512);
    CHECK(r == base_sector(98));

    // A range not of whole sectors, or past the disk's end, is refused naming it.
    CowDisk partial(base_path, overlay_dir.path);
    CHECK_THROWS_WITH_AS(partial.add_layer(layer(), Ranges{{512, 100}}), doctest::Contains("not whole sectors"), Error);
    CowDisk beyond(base_path, overlay_dir.path);
    CHECK_THROWS_WITH_AS(beyond.add_layer(layer(), Ranges{{99 * 512, 1024}}), doctest::Contains("leaves the disk"),
                         Error);
    // Under an empty overlay only.
    CowDisk written(base_path, overlay_dir.path);
    written.mark_written(0, 1);
    CHECK_THROWS_WITH_AS(written.add_layer(layer(), ranges), doctest::Contains("has been written"), Error);
}

TEST_CASE_FIXTURE(Fixture, "layers of layers: a sector reads from the topmost layer holding it")
{
    EventLoop loop;
    using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;
    using E = CowDisk::Extent;
    constexpr auto B = CowDisk::Source::base;
    constexpr auto L = CowDisk::Source::layer;
    constexpr auto O = CowDisk::Source::overlay;
    // Layer 0 holds sectors 2-5 (0x10), layer 1 sectors 4-7 (0x11): a fork over a snapshot.
    const auto make_layer = [&](const std::string& name, uint64_t first, uint64_t count, uint8_t fill) {
        std::vector<uint8_t> file(sectors * 512, 0);
        std::fill(file.begin() + first * 512, file.begin() + (first + count) * 512, fill);
        write_bytes(dir.path + "/" + name, file);
        return Fd(::open((dir.path + "/" + name).c_str(), O_RDONLY | O_CLOEXEC));
    };
    CowDisk disk(base_path, overlay_dir.path);
    disk.add_layer(make_layer("layer0", 2, 4, 0x10), Ranges{{2 * 512, 4 * 512}});
    disk.add_layer(make_layer("layer1", 4, 4, 0x11), Ranges{{4 * 512, 4 * 512}});
    CHECK(disk.layer_count() == 2);
    CHECK(disk.plan_read(1, 8) == std::vector<E>{{1, 1, B}, {2, 2, L, 0}, {4, 4, L, 1}, {8, 1, B}});
    std::vector<uint8_t> r(8 * 512);
    iovec rv{r.data(), r.size()};
    REQUIRE(run(loop, [&](auto done) { disk.read(loop, 1, {&rv, 1}, done); }) == 8 * 512);
    CHECK(std::vector<uint8_t>(r.begin(), r.begin() + 512) == base_sector(1));
    CHECK(std::vector<uint8_t>(r.begin() + 512, r.begin() + 3 * 512) == std::vector<uint8_t>(2 * 512, 0x10));
    CHECK(std::vector<uint8_t>(r.begin() + 3 * 512, r.begin() + 7 * 512) == std::vector<uint8_t>(4 * 512, 0x11));
    CHECK(std::vector<uint8_t>(r.begin() + 7 * 512, r.end()) == base_sector(8));
    // What each layer still provides, and what a snapshot stores: the union.
    CHECK(disk.layer_byte_ranges(0) == Ranges{{2 * 512, 2 * 512}});
    CHECK(disk.layer_byte_ranges(1) == Ranges{{4 * 512, 4 * 512}});
    std::vector<uint8_t> w(512, 0xee);
    iovec wv{w.data(), w.size()};
    REQUIRE(run(loop, [&](auto done) { disk.write(loop, 5, {&wv, 1}, done); }) == 512);
    CHECK(disk.plan_read(4, 3) == std::vector<E>{{4, 1, L, 1}, {5, 1, O}, {6, 1, L, 1}});
    CHECK(disk.layer_byte_ranges(1) == Ranges{{4 * 512, 512}, {6 * 512, 2 * 512}});
    CHECK(disk.overlay_byte_ranges() == Ranges{{5 * 512, 512}});
    CHECK(disk.save().written[0] == 0xfcull);

    // A chain has a bounded depth.
    CowDisk deep(base_path, overlay_dir.path);
    for (size_t i = 0; i < CowDisk::max_layers; ++i)
        deep.add_layer(make_layer("deep", 0, 1, 1), Ranges{{0, 512}});
    CHECK_THROWS_WITH_AS(deep.add_layer(make_layer("deep", 0, 1, 1), Ranges{{0, 512}}),
                         doctest::Contains("layers already"), Error);
}

TEST_CASE_FIXTURE(Fixture, "tracked writes: only those after track_writes(), handed over once")
{
    CowDisk disk(base_path, overlay_dir.path);
    using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;
    disk.mark_written(1, 2);
    CHECK(disk.tracked_byte_ranges().empty());  // not tracking: nothing recorded apart
    disk.track_writes();
    disk.mark_written(2, 2);  // overlaps a sector written before
    disk.mark_written(98, 2);
    CHECK(disk.tracked_byte_ranges() == Ranges{{2 * 512, 2 * 512}, {98 * 512, 2 * 512}});
    disk.mark_written(50, 1);
    CHECK(disk.tracked_byte_ranges().empty());  // handing over stopped the tracking
    CHECK(disk.overlay_byte_ranges() == Ranges{{1 * 512, 3 * 512}, {50 * 512, 512}, {98 * 512, 2 * 512}});
    disk.track_writes();
    CHECK(disk.tracked_byte_ranges().empty());
}
