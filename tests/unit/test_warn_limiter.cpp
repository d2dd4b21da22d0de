// The one helper for warnings a guest can trigger at will (common/warn_limiter.hpp): a burst
// per period gets through, the rest are counted and the count is told with the next one.
#include <doctest/doctest.h>

#include <chrono>
#include <thread>

#include "common/warn_limiter.hpp"

using namespace agentvm;

TEST_CASE("a burst per period gets through; what was held back is counted and told with the next one")
{
    WarnLimiter limiter(3, std::chrono::seconds(1));
    uint64_t suppressed = 99;
    for (int i = 0; i < 3; ++i) {
        CHECK(limiter.allow(&suppressed));
        CHECK(suppressed == 0);
    }
    for (int i = 0; i < 1000; ++i)
        CHECK_FALSE(limiter.allow());
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    CHECK(limiter.allow(&suppressed));
    CHECK(suppressed == 1000);
    CHECK(limiter.allow(&suppressed));
    CHECK(suppressed == 0);
}
