#include "vmm/live_copy.hpp"

#include <fmt/format.h>

#include "common/error.hpp"

namespace agentvm {
namespace {

constexpr uint8_t in_now = 1;
constexpr uint8_t in_copied = 2;
constexpr uint8_t in_soft_dirty = 4;

void mark(std::vector<uint8_t>& pages, const std::vector<IndexRun>& runs, uint8_t flag)
{
    for (const IndexRun& run : runs) {
        if (run.first > pages.size() || run.count > pages.size() - run.first)
            throw Error(fmt::format("pages [{}, +{}) are outside the {} pages of guest RAM", run.first, run.count,
                                    pages.size()));
        for (uint64_t p = run.first; p < run.first + run.count; ++p)
            pages[p] |= flag;
    }
}

void add(std::vector<IndexRun>& runs, uint64_t page)
{
    if (!runs.empty() && runs.back().first + runs.back().count == page)
        ++runs.back().count;
    else
        runs.push_back({page, 1});
}

} // namespace

PausedPages paused_pages(uint64_t ram_pages, const std::vector<IndexRun>& now, const std::vector<IndexRun>& copied,
                         bool tracked, const std::vector<IndexRun>& soft_dirty)
{
    std::vector<uint8_t> pages(ram_pages, 0);
    mark(pages, now, in_now);
    mark(pages, copied, in_copied);
    mark(pages, soft_dirty, in_soft_dirty);
    PausedPages result;
    for (uint64_t p = 0; p < ram_pages; ++p) {
        const uint8_t f = pages[p];
        if ((f & in_now) && (!(f & in_copied) || !tracked || (f & in_soft_dirty)))
            add(result.write, p);
        else if ((f & in_copied) && !(f & in_now))
            add(result.punch, p);
    }
    return result;
}

} // namespace agentvm
