#include "service/pools.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

namespace agentvm {
namespace {

constexpr auto max_refill_backoff = std::chrono::seconds(30);

} // namespace

Pools::Pools(const std::vector<PoolConfig>& configs, unsigned refill_concurrency, bool warmup, Admission& admission,
             StartVm start, Now now)
    : refill_concurrency_(refill_concurrency), warmup_(warmup), admission_(admission), start_(std::move(start)),
      now_(std::move(now))
{
    for (const PoolConfig& pool : configs)
        pools_[pool.name].config = pool;
}

Pool* Pools::find(const std::string& name)
{
    auto it = pools_.find(name);
    return it == pools_.end() ? nullptr : &it->second;
}

std::string Pools::default_pool() const
{
    if (pools_.size() == 1)
        return pools_.begin()->first;
    return "default";
}

std::vector<std::string> Pools::names() const
{
    std::vector<std::string> names;
    for (const auto& [name, pool] : pools_)
        names.push_back(name);
    return names;
}

Sandbox* Pools::take_warm(Pool& pool)
{
    while (!pool.warm.empty()) {
        Sandbox* sandbox = pool.warm.front();
        pool.warm.pop_front();
        if (!sandbox->stopping())
            return sandbox;
    }
    return nullptr;
}

bool Pools::evict_spare(const Pool& pool)
{
    for (auto& [name, other] : pools_) {
        if (&other == &pool || other.warm.empty())
            continue;
        Sandbox* spare = other.warm.front();
        other.warm.pop_front();
        spare->stop("evicted from its pool for a create");
        return true;
    }
    return false;
}

void Pools::refill()
{
    if (admission_.closed())
        return;
    const auto now = now_();
    for (auto& [name, pool] : pools_) {
        while (pool.warm.size() + pool.starting + pool.warming < pool.config.target
               && pool.starting < refill_concurrency_ && now >= pool.next_refill) {
            // A refill runs from timers and exits, outside any request: what it throws (out
            // of descriptors, /proc/meminfo unreadable) would end serve. It waits instead.
            try {
                if (!admission_.refill_may_start())
                    return;
                start_(pool);
                ++pool.starting;
            } catch (const std::exception& e) {
                spdlog::error("pool {}: {}", name, e.what());
                pool.next_refill = now + max_refill_backoff;
                break;
            }
        }
    }
}

void Pools::drain()
{
    for (auto& [name, pool] : pools_) {
        for (Sandbox* sandbox : pool.warm)
            sandbox->stop("serve is shutting down");
        pool.warm.clear();
    }
}

void Pools::refill_ready(Pool& pool, const std::shared_ptr<Sandbox>& sandbox)
{
    --pool.starting;
    pool.failures_in_row = 0;
    if (admission_.closed() || pool.warm.size() >= pool.config.target) {
        sandbox->stop("not needed in the pool");
        return;
    }
    if (!warmup_)
        return add_warm(pool, *sandbox);
    std::weak_ptr<Sandbox> weak = sandbox;
    ++pool.warming;
    sandbox->call(Json{{"op", "exec"}, {"argv", {"true"}}}, std::nullopt,
                  CallHandlers{[](Json&&) {}, [this, weak, &pool](Json&& answer) {
                                   --pool.warming;
                                   auto warmed = weak.lock();
                                   if (!warmed || warmed->stopping())
                                       return;
                                   if (answer.value("exit_code", 1) != 0) {
                                       spdlog::error("pool {}: the warm-up call failed: {}", pool.config.name,
                                                     answer.dump());
                                       return warmed->stop("its warm-up call failed");
                                   }
                                   add_warm(pool, *warmed);
                               }});
}

void Pools::add_warm(Pool& pool, Sandbox& sandbox)
{
    if (admission_.closed() || pool.warm.size() >= pool.config.target) {
        sandbox.stop("not needed in the pool");
        return;
    }
    pool.warm.push_back(&sandbox);
    refill();
}

void Pools::refill_failed(Pool& pool)
{
    --pool.starting;
    ++pool.failures_in_row;
    const auto backoff = std::min<std::chrono::milliseconds>(
        max_refill_backoff, std::chrono::milliseconds(250 << std::min(pool.failures_in_row, 10u)));
    pool.next_refill = now_() + backoff;
}

void Pools::vm_ended(Pool& pool, Sandbox& sandbox)
{
    --pool.vms;
    std::erase(pool.warm, &sandbox);
    forget_if_unused(pool);
}

Pool& Pools::restore_pool(const std::string& snapshot, const std::string& name)
{
    Pool& pool = restore_pools_[snapshot];
    pool.config.name = name;
    pool.config.episode_args = {"--snapshot", snapshot};
    return pool;
}

void Pools::forget_if_unused(Pool& pool)
{
    // One per snapshot ever forked from or resumed: kept only while a VM of it runs, or
    // serve's memory would grow with every fork and resume.
    if (pool.vms == 0)
        std::erase_if(restore_pools_, [&pool](const auto& entry) { return &entry.second == &pool; });
}

} // namespace agentvm

