#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

#include "core/guest_memory.hpp"
#include "core/layout.hpp"
#include "core/soft_dirty.hpp"

using namespace agentvm;

TEST_CASE("small RAM is one region starting at zero")
{
    GuestMemory mem(16 * layout::mib);
    REQUIRE(mem.regions().size() == 1);
    CHECK(mem.regions()[0].gpa == 0);
    CHECK(mem.regions()[0].size == 16 * layout::mib);
    CHECK(mem.ram_size() == 16 * layout::mib);
}

TEST_CASE("RAM above the MMIO gap continues at 4 GiB")
{
    GuestMemory mem(layout::mmio_gap_start + 64 * layout::mib);
    REQUIRE(mem.regions().size() == 2);
    CHECK(mem.regions()[1].gpa == layout::mmio_gap_end);
    CHECK(mem.regions()[1].size == 64 * layout::mib);
    CHECK(mem.contains(layout::mmio_gap_end, 4096));
    CHECK_FALSE(mem.contains(layout::mmio_gap_start, 1));
    CHECK_FALSE(mem.contains(layout::virtio_mmio_base, 4));
}

TEST_CASE("objects round-trip and writes are visible through span")
{
    GuestMemory mem(1 * layout::mib);
    mem.write_obj<uint64_t>(0x1000, 0x1122334455667788ull);
    CHECK(mem.read_obj<uint64_t>(0x1000) == 0x1122334455667788ull);
    CHECK(mem.span(0x1000, 1)[0] == 0x88);
    std::vector<uint8_t> in{1, 2, 3};
    mem.write(0x2000, in);
    std::vector<uint8_t> out(3);
    mem.read(0x2000, out);
    CHECK(out == in);
}

TEST_CASE("accesses that leave RAM throw GuestError")
{
    GuestMemory mem(1 * layout::mib);
    const uint64_t end = layout::mib;
    CHECK(mem.contains(end - 8, 8));
    CHECK(mem.contains(end, 0));
    CHECK_FALSE(mem.contains(end - 7, 8));
    CHECK_THROWS_AS(mem.read_obj<uint64_t>(end - 4), GuestError);
    CHECK_THROWS_AS(mem.span(end, 1), GuestError);
    // A length that would wrap the address space must not pass the check.
    CHECK_FALSE(mem.contains(0x1000, UINT64_MAX));
    CHECK_FALSE(mem.contains(UINT64_MAX, 2));
    CHECK_THROWS_AS(mem.span(UINT64_MAX - 1, 4), GuestError);
}

TEST_CASE("sizes that are not whole pages are refused")
{
    CHECK_THROWS_AS(GuestMemory(0), Error);
    CHECK_THROWS_AS(GuestMemory(4097), Error);
}

namespace {

Fd temp_file()
{
    Fd fd(::open("/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
    REQUIRE(fd);
    return fd;
}

uint64_t allocated_bytes(int fd)
{
    struct stat st {};
    REQUIRE(::fstat(fd, &st) == 0);
    return static_cast<uint64_t>(st.st_blocks) * 512;
}

} // namespace

TEST_CASE("a snapshot of RAM keeps every byte and stores zero pages as holes")
{
    const uint64_t ram = 8 << 20;
    GuestMemory mem(ram);
    mem.write_obj<uint64_t>(0x1000, 0x1122334455667788);
    mem.write_obj<uint8_t>(ram - 1, 0xab);
    mem.write_obj<uint64_t>(0x200000, 0);  // touched, but still zero: a hole too
    Fd file = temp_file();
    CHECK(mem.save_to(file.get()) == 2 * 4096);
    CHECK(allocated_bytes(file.get()) <= 2 * 4096 + 4096);

    GuestMemory restored = GuestMemory::from_snapshot(Fd(::dup(file.get())), ram, "test");
    CHECK(restored.read_obj<uint64_t>(0x1000) == 0x1122334455667788);
    CHECK(restored.read_obj<uint8_t>(ram - 1) == 0xab);
    CHECK(restored.read_obj<uint64_t>(0x200000) == 0);

    // The restored guest's writes stay private: the file, and so every other clone, is unchanged.
    restored.write_obj<uint64_t>(0x1000, 42);
    GuestMemory clone = GuestMemory::from_snapshot(Fd(::dup(file.get())), ram, "test");
    CHECK(clone.read_obj<uint64_t>(0x1000) == 0x1122334455667788);

    // Saving the restored guest again includes its private writes, also in former holes.
    restored.write_obj<uint64_t>(0x300000, 7);
    Fd again = temp_file();
    CHECK(restored.save_to(again.get()) == 3 * 4096);
    GuestMemory second = GuestMemory::from_snapshot(std::move(again), ram, "test");
    CHECK(second.read_obj<uint64_t>(0x1000) == 42);
    CHECK(second.read_obj<uint64_t>(0x300000) == 7);
}

TEST_CASE("a snapshot memory file of the wrong size is refused")
{
    Fd file = temp_file();
    REQUIRE(::ftruncate(file.get(), 4 << 20) == 0);
    CHECK_THROWS_AS(GuestMemory::from_snapshot(Fd(::dup(file.get())), 8 << 20, "short"), Error);
    CHECK_THROWS_WITH(GuestMemory::from_snapshot(std::move(file), 8 << 20, "short"),
                      doctest::Contains("truncated"));
}

TEST_CASE("a restored guest's own pages: found through pagemap, saved as a layer, mapped over the base")
{
    const uint64_t ram = 8 << 20;
    const uint64_t page = 4096;
    GuestMemory booted(ram);
    booted.write_obj<uint64_t>(0, 1);
    booted.write_obj<uint64_t>(5 * page, 5);
    Fd base = temp_file();
    booted.save_to(base.get());
    Fd pagemap(::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC));
    REQUIRE(pagemap);

    // RAM of its own (a memfd) has no snapshot below to tell its pages apart from.
    CHECK_THROWS_WITH_AS(booted.private_pages(pagemap.get()), doctest::Contains("not mapped from a snapshot"), Error);

    GuestMemory parent = GuestMemory::from_snapshot(Fd(::dup(base.get())), ram, "base");
    // Read pages, whether from the file or its holes, stay the file's.
    CHECK(parent.read_obj<uint64_t>(5 * page) == 5);
    CHECK(parent.read_obj<uint64_t>(9 * page) == 0);
    CHECK(parent.private_pages(pagemap.get()).owned.empty());
    // Written pages become the process's own; page 11 is written with zeros.
    parent.write_obj<uint64_t>(5 * page, 55);
    parent.write_obj<uint64_t>(6 * page, 66);
    parent.write_obj<uint64_t>(11 * page, 0);
    parent.write_obj<uint64_t>(ram - 8, 77);
    const std::vector<IndexRun> own = parent.private_pages(pagemap.get()).owned;
    CHECK(own == std::vector<IndexRun>{{5, 2}, {11, 1}, {ram / page - 1, 1}});

    // The layer stores their data (the zero page as a hole) at their offsets.
    Fd layer = temp_file();
    CHECK(parent.save_pages_to(layer.get(), own) == 3 * page);
    struct stat st {};
    REQUIRE(::fstat(layer.get(), &st) == 0);
    CHECK(static_cast<uint64_t>(st.st_size) == ram);

    // A child maps the base, then the layer's runs over it: every byte is the parent's.
    std::vector<MemoryLayer> layers;
    layers.push_back({Fd(::dup(layer.get())), own});
    GuestMemory child = GuestMemory::from_snapshot(Fd(::dup(base.get())), ram, "base", std::move(layers));
    CHECK(child.read_obj<uint64_t>(0) == 1);
    CHECK(child.read_obj<uint64_t>(5 * page) == 55);
    CHECK(child.read_obj<uint64_t>(6 * page) == 66);
    CHECK(child.read_obj<uint64_t>(11 * page) == 0);
    CHECK(child.read_obj<uint64_t>(ram - 8) == 77);
    // Nothing is the child's own until it writes; its writes reach neither file.
    CHECK(child.private_pages(pagemap.get()).owned.empty());
    child.write_obj<uint64_t>(6 * page, 600);
    CHECK(child.private_pages(pagemap.get()).owned == std::vector<IndexRun>{{6, 1}});
    GuestMemory sibling = GuestMemory::from_snapshot(Fd(::dup(base.get())), ram, "base",
                                                     [&] {
                                                         std::vector<MemoryLayer> l;
                                                         l.push_back({Fd(::dup(layer.get())), own});
                                                         return l;
                                                     }());
    CHECK(sibling.read_obj<uint64_t>(6 * page) == 66);

    // A layer's runs must lie inside RAM, and its file be RAM's size.
    std::vector<MemoryLayer> outside;
    outside.push_back({Fd(::dup(layer.get())), {{ram / page - 1, 2}}});
    CHECK_THROWS_WITH_AS(GuestMemory::from_snapshot(Fd(::dup(base.get())), ram, "base", std::move(outside)),
                         doctest::Contains("outside"), Error);
    Fd small = temp_file();
    REQUIRE(::ftruncate(small.get(), 4096) == 0);
    std::vector<MemoryLayer> short_layer;
    short_layer.push_back({std::move(small), {{0, 1}}});
    CHECK_THROWS_WITH_AS(GuestMemory::from_snapshot(Fd(::dup(base.get())), ram, "base", std::move(short_layer)),
                         doctest::Contains("truncated"), Error);
}

TEST_CASE("soft-dirty bits tell the pages written since the clear, and a save over old data punches zeros")
{
    const uint64_t ram = 4 << 20;
    const uint64_t page = 4096;
    GuestMemory booted(ram);
    Fd base = temp_file();
    booted.save_to(base.get());
    Fd pagemap(::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC));
    REQUIRE(pagemap);
    GuestMemory mem = GuestMemory::from_snapshot(Fd(::dup(base.get())), ram, "base");
    mem.write_obj<uint64_t>(2 * page, 2);
    mem.write_obj<uint64_t>(3 * page, 3);

    SoftDirtyBits bits(pagemap.get());
    const bool kept = bits.clear();
    MESSAGE("this kernel " << (kept ? "keeps" : "keeps no") << " soft-dirty bits");
    CHECK(mem.private_pages(pagemap.get()).soft_dirty.empty());
    mem.write_obj<uint64_t>(3 * page, 33);
    mem.write_obj<uint64_t>(7 * page, 7);
    const GuestMemory::PrivatePages found = mem.private_pages(pagemap.get());
    CHECK(found.owned == std::vector<IndexRun>{{2, 2}, {7, 1}});
    // Without the bits (CONFIG_MEM_SOFT_DIRTY off) nothing reads dirty, as clear() said.
    CHECK(found.soft_dirty == (kept ? std::vector<IndexRun>{{3, 1}, {7, 1}} : std::vector<IndexRun>{}));

    Fd layer = temp_file();
    CHECK(mem.save_pages_to(layer.get(), found.owned) == 3 * page);
    mem.write_obj<uint64_t>(3 * page, 0);  // page 3 is all zeros now
    CHECK(mem.save_pages_to(layer.get(), std::vector<IndexRun>{{3, 1}}, true) == 0);
    uint64_t value = 1;
    REQUIRE(::pread(layer.get(), &value, sizeof value, 3 * page) == sizeof value);
    CHECK(value == 0);
    CHECK(::lseek(layer.get(), 3 * page, SEEK_HOLE) == static_cast<off_t>(3 * page));
    REQUIRE(::pread(layer.get(), &value, sizeof value, 2 * page) == sizeof value);
    CHECK(value == 2);
}
