#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

#include "common/error.hpp"
#include "common/fd.hpp"
#include "core/guest_memory.hpp"
#include "vmm/warm_pages.hpp"

using namespace agentvm;
using nlohmann::json;

namespace {

constexpr uint64_t page = 4096;

// /proc/self/pagemap's entry for a host address: bit 63 present, bit 61 a file (page cache) page.
uint64_t pagemap_entry(const void* addr)
{
    Fd map(::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC));
    REQUIRE(map);
    uint64_t entry = 0;
    const off_t at = static_cast<off_t>(reinterpret_cast<uintptr_t>(addr) / page * sizeof(entry));
    REQUIRE(::pread(map.get(), &entry, sizeof(entry), at) == static_cast<ssize_t>(sizeof(entry)));
    return entry;
}

bool private_copy(const void* addr)
{
    const uint64_t entry = pagemap_entry(addr);
    return (entry >> 63 & 1) && !(entry >> 61 & 1);
}

} // namespace

TEST_CASE("page runs go to JSON and back; malformed ones are refused")
{
    const std::vector<PageRun> runs{{0, 3}, {10, 1}, {99, 1}};
    CHECK(runs_to_json(runs) == json::parse("[[0,3],[10,1],[99,1]]"));
    CHECK(page_runs_from_json(runs_to_json(runs), 100) == runs);
    CHECK(page_runs_from_json(json::array(), 100).empty());

    for (const char* bad : {"{}", "[[1]]", "[[1,2,3]]", "[[-1,2]]", "[[1,\"2\"]]", "[[5,0]]", "[[10,1],[5,1]]",
                            "[[0,3],[2,1]]", "[[100,1]]", "[[99,2]]", "[[0,18446744073709551615]]"}) {
        CAPTURE(bad);
        CHECK_THROWS_AS(page_runs_from_json(json::parse(bad), 100), Error);
    }
}

TEST_CASE("runs merge across small gaps, then wider ones until few enough remain")
{
    using Runs = std::vector<IndexRun>;
    const Runs runs{{0, 2}, {3, 1}, {10, 1}, {30, 2}, {100, 1}};
    CHECK(merge_runs(runs, 0, 100) == runs);
    CHECK(merge_runs(Runs{{0, 2}, {2, 1}}, 0, 100) == Runs{{0, 3}});  // adjacent ones always
    CHECK(merge_runs(runs, 1, 100) == Runs{{0, 4}, {10, 1}, {30, 2}, {100, 1}});
    CHECK(merge_runs(runs, 6, 100) == Runs{{0, 11}, {30, 2}, {100, 1}});
    // At most 2: gaps of 1, 2, 4, ... 32 are closed in turn, until 2 runs are left.
    CHECK(merge_runs(runs, 1, 2) == Runs{{0, 32}, {100, 1}});
    CHECK(merge_runs(runs, 0, 1) == Runs{{0, 101}});
    CHECK(merge_runs(runs, 0, 0) == Runs{{0, 101}});
    CHECK(merge_runs(Runs{}, 16, 4).empty());
}

TEST_CASE("warm pages of snapshot memory become private copies, with the file's content")
{
    Fd file(::open("/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
    REQUIRE(file);
    std::vector<uint8_t> content(16 * page);
    for (size_t i = 0; i < content.size(); ++i)
        content[i] = static_cast<uint8_t>(i / page + 1);
    REQUIRE(::pwrite(file.get(), content.data(), content.size(), 0) == static_cast<ssize_t>(content.size()));

    const GuestMemory mem = GuestMemory::from_snapshot(Fd(::dup(file.get())), 16 * page, "test");
    copy_warm_pages(mem, {{2, 3}, {9, 1}});
    for (uint64_t p : {2, 3, 4, 9}) {
        CAPTURE(p);
        CHECK(private_copy(mem.span(p * page, page).data()));
        CHECK(mem.read_obj<uint8_t>(p * page + 100) == p + 1);
    }
    for (uint64_t p : {1, 5, 8, 10}) {
        CAPTURE(p);
        CHECK_FALSE(private_copy(mem.span(p * page, page).data()));
    }
    // Private: writing them leaves the file as it was.
    mem.write_obj<uint8_t>(2 * page, 0xee);
    uint8_t first = 0;
    REQUIRE(::pread(file.get(), &first, 1, 2 * page) == 1);
    CHECK(first == 3);

    CHECK_THROWS_AS(mem.populate_private(15, 2), Error);
}
