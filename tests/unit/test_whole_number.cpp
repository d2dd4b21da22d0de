// The one reader of decimal numbers in flags, environment variables and wire formats
// (common/whole_number.hpp): the whole text is digits and the value fits, or it is refused.
#include <doctest/doctest.h>

#include <cstdint>

#include "common/whole_number.hpp"

using namespace agentvm;

TEST_CASE("whole_number takes digits only, all of the text, within the type")
{
    CHECK(whole_number<uint32_t>("0") == 0u);
    CHECK(whole_number<uint32_t>("4294967295") == 4294967295u);
    CHECK(whole_number<uint64_t>("007") == 7u);
    CHECK_FALSE(whole_number<uint32_t>("4294967296"));
    CHECK_FALSE(whole_number<uint8_t>("256"));
    for (const char* refused : {"", " 1", "1 ", "+1", "-1", "-0", "1x", "0x10", "1.5", "1e3"})
        CHECK_MESSAGE(!whole_number<uint64_t>(refused), "'", refused, "'");
}

TEST_CASE("port_number is 1 to 65535, and 0 only where binding any port is meant")
{
    CHECK(port_number("1") == 1);
    CHECK(port_number("65535") == 65535);
    CHECK_FALSE(port_number("65536"));
    CHECK_FALSE(port_number("0"));
    CHECK(port_number("0", true) == 0);
    CHECK_FALSE(port_number(""));
    CHECK_FALSE(port_number("80/tcp"));
    CHECK_FALSE(port_number("4294967376")); // 65616 after a 32-bit wrap: refused, not wrapped
}
