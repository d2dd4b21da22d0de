#include <doctest/doctest.h>

#include <vector>

#include "common/error.hpp"
#include "vmm/live_copy.hpp"

using namespace agentvm;

using Runs = std::vector<IndexRun>;

TEST_CASE("the pause writes again only pages new since the copy or written during it")
{
    // Copied while running: [0,4) and [10,12). Now owned: [0,6) and [10,11). Written since: page 2.
    const Runs now{{0, 6}, {10, 1}};
    const Runs copied{{0, 4}, {10, 2}};
    const Runs dirty{{2, 1}};
    const PausedPages tracked = paused_pages(16, now, copied, true, dirty);
    CHECK(tracked.write == Runs{{2, 1}, {4, 2}});
    CHECK(tracked.punch == Runs{{11, 1}});  // copied, but no longer in what the snapshot maps
    // Without soft-dirty bits every page owned now is written again.
    const PausedPages untracked = paused_pages(16, now, copied, false, {});
    CHECK(untracked.write == now);
    CHECK(untracked.punch == Runs{{11, 1}});
    // A page soft-dirty but not owned (never the case from pagemap) is not written.
    CHECK(paused_pages(16, {}, {}, true, Runs{{3, 1}}).write.empty());
}

TEST_CASE("runs outside RAM are refused")
{
    CHECK_THROWS_AS(paused_pages(16, Runs{{15, 2}}, {}, true, {}), Error);
    CHECK_THROWS_AS(paused_pages(16, {}, Runs{{~0ull, 2}}, true, {}), Error);
}
