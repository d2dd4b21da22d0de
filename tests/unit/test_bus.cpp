#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "core/bus.hpp"
#include "common/error.hpp"

using namespace agentvm;

namespace {

struct Recorder : BusDevice {
    std::vector<uint64_t> reads;
    std::vector<std::pair<uint64_t, uint8_t>> writes;
    void bus_read(uint64_t offset, std::span<uint8_t> data) override
    {
        reads.push_back(offset);
        for (auto& b : data)
            b = 0xab;
    }
    void bus_write(uint64_t offset, std::span<const uint8_t> data) override
    {
        writes.emplace_back(offset, data[0]);
    }
};

} // namespace

TEST_CASE("accesses reach the device with offsets relative to its base")
{
    Bus bus;
    Recorder a, b;
    bus.insert(0x3f8, 8, a);
    bus.insert(0x1000, 0x100, b);
    uint8_t byte = 0;
    CHECK(bus.read(0x3fd, {&byte, 1}));
    CHECK(byte == 0xab);
    REQUIRE(a.reads.size() == 1);
    CHECK(a.reads[0] == 5);
    const uint8_t value = 7;
    CHECK(bus.write(0x10ff, {&value, 1}));
    REQUIRE(b.writes.size() == 1);
    CHECK(b.writes[0] == std::pair<uint64_t, uint8_t>{0xff, 7});
}

TEST_CASE("unclaimed and straddling accesses are refused")
{
    Bus bus;
    Recorder a;
    bus.insert(0x100, 0x10, a);
    uint8_t data[4] = {1, 2, 3, 4};
    CHECK_FALSE(bus.read(0xff, {data, 1}));
    CHECK_FALSE(bus.read(0x110, {data, 1}));
    CHECK_FALSE(bus.read(0x10e, {data, 4}));  // starts inside, ends outside
    CHECK(data[0] == 1);                      // untouched on refusal
    CHECK(a.reads.empty());
}

TEST_CASE("overlapping or empty ranges are rejected at insert")
{
    Bus bus;
    Recorder a, b;
    bus.insert(0x100, 0x10, a);
    CHECK_THROWS_AS(bus.insert(0x10f, 1, b), Error);
    CHECK_THROWS_AS(bus.insert(0xf0, 0x11, b), Error);
    CHECK_THROWS_AS(bus.insert(0x200, 0, b), Error);
    CHECK_THROWS_AS(bus.insert(UINT64_MAX, 2, b), Error);
    CHECK_NOTHROW(bus.insert(0x110, 0x10, b));
}
