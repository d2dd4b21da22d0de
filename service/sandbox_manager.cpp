#include "service/sandbox_manager.hpp"

#include <sys/random.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "service/vm_priority.hpp"

namespace agentvm {
namespace {

constexpr size_t ended_remembered = 4096;
constexpr auto sweep_period = std::chrono::milliseconds(250);
constexpr auto max_refill_backoff = std::chrono::seconds(30);

// MemAvailable from /proc/meminfo, in MiB: what the host can still give without swapping.
uint64_t host_available_mib()
{
    std::ifstream meminfo("/proc/meminfo");
    std::string key;
    uint64_t kib = 0;
    std::string unit;
    while (meminfo >> key >> kib >> unit) {
        if (key == "MemAvailable:")
            return kib / 1024;
    }
    throw Error("/proc/meminfo has no MemAvailable");
}

// The 503 a VM start gets while the host has less than the reserve available.
std::optional<Refusal> below_memory_reserve(uint64_t reserve_mib)
{
    const uint64_t available = host_available_mib();
    if (available >= reserve_mib)
        return std::nullopt;
    return Refusal{ServiceError::memory_reserve,
                   fmt::format("the host has {} MiB available, under the {} MiB reserve (--mem-reserve)", available,
                               reserve_mib),
                   5};
}

double seconds_since(Sandbox::Clock::time_point start)
{
    return std::chrono::duration<double>(Sandbox::Clock::now() - start).count();
}

} // namespace

SandboxManager::SandboxManager(EventLoop& loop, ManagerConfig config)
    : loop_(loop), config_(std::move(config)), bury_timer_(loop_, [this] { graveyard_.clear(); }),
      sweep_timer_(loop_, [this] { sweep(); }), drain_timer_(loop_, [this] {
          drain_grace_over_ = true;
          check_drained();
      })
{
    cpu_weights_ = cpu_weights_supported();
    if (!config_.state_dir.empty())
        store_.emplace(config_.state_dir);
    for (const PoolConfig& pool : config_.pools)
        pools_[pool.name].config = pool;
    refill();
    sweep_timer_.arm(sweep_period);
}

SandboxManager::~SandboxManager()
{
    // Each Sandbox's EpisodeProcess kills and reaps its child as it goes.
    by_id_.clear();
    for (auto& [pointer, vm] : vms_)
        vm.waiting = nullptr;
    vms_.clear();
}

std::string SandboxManager::default_pool() const
{
    if (pools_.size() == 1)
        return pools_.begin()->first;
    return "default";
}

SandboxManager::Pool* SandboxManager::pool_named(const std::string& name)
{
    auto it = pools_.find(name);
    return it == pools_.end() ? nullptr : &it->second;
}

size_t SandboxManager::live_vms() const
{
    return static_cast<size_t>(std::count_if(vms_.begin(), vms_.end(),
                                             [](const auto& entry) { return !entry.second.sandbox->stopping(); }));
}

std::string SandboxManager::new_id() const
{
    for (;;) {
        unsigned char bytes[8];
        if (::getrandom(bytes, sizeof bytes, 0) != sizeof bytes)
            throw_errno("getrandom for a sandbox id");
        std::string id = "sb-";
        for (unsigned char b : bytes)
            id += fmt::format("{:02x}", b);
        if (!by_id_.contains(id) && !ended_.contains(id))
            return id;
    }
}

SandboxManager::Vm& SandboxManager::start_vm(Pool& pool, bool for_pool)
{
    std::vector<std::string> args = pool.config.episode_args;
    // Each VM writes its live snapshots into a directory of its own, the only one its jail
    // keeps writable: a VMM a guest took over can write no other sandbox's snapshots.
    std::string outbox;
    if (store_) {
        outbox = store_->new_outbox();
        args.insert(args.end(), {"--snapshot-dir", outbox});
    }
    if (for_pool && cpu_weights_)
        args.insert(args.end(), {"--cpu-weight", std::to_string(pool_cpu_weight)});
    std::shared_ptr<Sandbox> sandbox;
    try {
        sandbox = std::make_shared<Sandbox>(
            loop_, pool.config.name, config_.program, args, config_.history_limit,
            Sandbox::Hooks{[this](Sandbox& s, bool) { on_ready(s); },
                           [this](Sandbox& s, const std::string& why) { on_exit(s, why); },
                           [this](const Json& answer, std::chrono::duration<double> took) {
                               count_call(answer, took.count());
                           }});
    } catch (const Error&) {
        if (store_)
            store_->remove_outbox(outbox);
        throw;
    }
    Sandbox* key = sandbox.get();
    Vm& vm = vms_[key];
    vm.sandbox = std::move(sandbox);
    vm.outbox = std::move(outbox);
    vm.pool = &pool;
    vm.refill = for_pool;
    vm.low_weight = for_pool && cpu_weights_;
    return vm;
}

std::optional<Refusal> SandboxManager::admit(Pool& pool)
{
    if (live_vms() >= config_.max_sandboxes) {
        // A warm VM of another pool gives way to a create that needs room (refill yields to
        // demand); a VM on its way out no longer counts.
        bool evicted = false;
        for (auto& [name, other] : pools_) {
            if (&other == &pool || other.warm.empty())
                continue;
            Sandbox* spare = other.warm.front();
            other.warm.pop_front();
            spare->stop("evicted from its pool for a create");
            evicted = true;
            break;
        }
        if (!evicted)
            return Refusal{ServiceError::at_capacity,
                           fmt::format("{} VMs are running, the most --max-sandboxes allows", live_vms()), 1};
    }
    return below_memory_reserve(config_.mem_reserve_mib);
}

void SandboxManager::create(const std::string& pool_name, Sandbox::Settings settings, CreateDone done)
{
    const auto requested = Sandbox::Clock::now();
    Pool* pool = pool_named(pool_name);
    if (!pool) {
        std::vector<std::string> names;
        for (const auto& [name, p] : pools_)
            names.push_back(name);
        const Refusal refusal{ServiceError::unknown_pool,
                              fmt::format("no pool named \"{}\" (serve has: {})", pool_name, fmt::join(names, ", ")),
                              std::nullopt};
        return done(nullptr, &refusal);
    }
    if (draining_) {
        ++refusals_["draining"];
        const Refusal refusal{ServiceError::draining, "serve is shutting down", std::nullopt};
        return done(nullptr, &refusal);
    }
    while (!pool->warm.empty()) {
        Sandbox* sandbox = pool->warm.front();
        pool->warm.pop_front();
        if (sandbox->stopping())
            continue;
        hand_out(vms_.at(sandbox), std::move(settings), requested, true);
        done(sandbox, nullptr);
        refill();
        return;
    }
    if (auto refusal = admit(*pool)) {
        ++refusals_[std::string(error_name(refusal->code))];
        return done(nullptr, &*refusal);
    }
    Vm* vm = nullptr;
    try {
        vm = &start_vm(*pool, false);
    } catch (const Error& e) {
        ++failures_["start_failed"];
        const Refusal refusal{ServiceError::start_failed, e.what(), std::nullopt};
        return done(nullptr, &refusal);
    }
    vm->waiting = std::move(done);
    vm->settings = std::move(settings);
    vm->requested = requested;
}

void SandboxManager::hand_out(Vm& vm, Sandbox::Settings settings, Sandbox::Clock::time_point requested, bool warm)
{
    if (settings.id.empty())  // a resumed sandbox keeps its id
        settings.id = new_id();
    settings.warm = warm;
    settings.create_time = std::chrono::duration_cast<std::chrono::milliseconds>(Sandbox::Clock::now() - requested);
    create_latency_.observe(seconds_since(requested));
    ++(warm ? vm.pool->created_warm : vm.pool->created_cold);
    vm.refill = false;
    if (vm.low_weight) {
        restore_cpu_weight(vm.sandbox->pid());
        vm.low_weight = false;
    }
    by_id_[settings.id] = vm.sandbox.get();
    vm.sandbox->assign(std::move(settings));
    spdlog::info("sandbox {} created ({}, pool {})", vm.sandbox->id(), warm ? "warm" : "cold", vm.pool->config.name);
}

void SandboxManager::on_ready(Sandbox& sandbox)
{
    Vm& vm = vms_.at(&sandbox);
    Pool& pool = *vm.pool;
    if (vm.refill) {
        --pool.starting;
        pool.failures_in_row = 0;
    }
    if (vm.waiting) {
        CreateDone done = std::move(vm.waiting);
        vm.waiting = nullptr;
        hand_out(vm, std::move(vm.settings), vm.requested, false);
        done(&sandbox, nullptr);
        return;
    }
    if (draining_ || pool.warm.size() >= pool.config.target) {
        sandbox.stop("not needed in the pool");
        return;
    }
    if (!config_.pool_warmup)
        return add_warm(pool, sandbox);
    std::weak_ptr<Sandbox> weak = vm.sandbox;
    ++pool.warming;
    sandbox.call(Json{{"op", "exec"}, {"argv", {"true"}}}, std::nullopt,
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

void SandboxManager::add_warm(Pool& pool, Sandbox& sandbox)
{
    if (draining_ || pool.warm.size() >= pool.config.target) {
        sandbox.stop("not needed in the pool");
        return;
    }
    pool.warm.push_back(&sandbox);
    refill();
}

void SandboxManager::on_exit(Sandbox& sandbox, const std::string& why)
{
    auto node = vms_.extract(&sandbox);
    Vm& vm = node.mapped();
    Pool& pool = *vm.pool;
    if (!sandbox.ready()) {
        ++failures_["start_failed"];
        spdlog::error("pool {}: a VM failed to start: {}", pool.config.name, why);
        if (vm.refill) {
            --pool.starting;
            ++pool.failures_in_row;
            const auto backoff = std::min<std::chrono::milliseconds>(
                max_refill_backoff, std::chrono::milliseconds(250 << std::min(pool.failures_in_row, 10u)));
            pool.next_refill = Sandbox::Clock::now() + backoff;
        }
        if (vm.waiting) {
            const Refusal refusal{ServiceError::start_failed, "the sandbox's VM did not start: " + why, std::nullopt};
            vm.waiting(nullptr, &refusal);
        }
    }
    std::erase(pool.warm, &sandbox);
    prune_restore_pool(pool);
    if (sandbox.assigned()) {
        if (auto it = by_id_.find(sandbox.id()); it != by_id_.end()) {
            // Not removed by anyone: the VM died under its user.
            by_id_.erase(it);
            ++failures_["vm_died"];
            remember_end(sandbox.id(), "vm_died: " + why);
        }
    }
    if (!vm.origin.empty())
        store_->release(vm.origin);
    if (!vm.outbox.empty())
        store_->remove_outbox(vm.outbox);
    graveyard_.push_back(std::move(vm.sandbox));
    bury_timer_.arm(std::chrono::nanoseconds(1));
    if (draining_)
        check_drained();
    else
        refill();
}

void SandboxManager::refill()
{
    if (draining_)
        return;
    const auto now = Sandbox::Clock::now();
    for (auto& [name, pool] : pools_) {
        while (pool.warm.size() + pool.starting + pool.warming < pool.config.target
               && pool.starting < config_.refill_concurrency && now >= pool.next_refill && live_vms() < config_.max_sandboxes) {
            // A refill runs from timers and exits, outside any request: what it throws (out
            // of descriptors, /proc/meminfo unreadable) would end serve. It waits instead.
            try {
                if (host_available_mib() < config_.mem_reserve_mib)
                    return;
                start_vm(pool, true);
                ++pool.starting;
            } catch (const std::exception& e) {
                spdlog::error("pool {}: {}", name, e.what());
                pool.next_refill = now + max_refill_backoff;
                break;
            }
        }
    }
}

void SandboxManager::sweep()
{
    const auto now = Sandbox::Clock::now();
    std::vector<std::pair<Sandbox*, std::string>> expired;
    for (const auto& [id, sandbox] : by_id_) {
        if (auto why = sandbox->expired(now))
            expired.emplace_back(sandbox, *why);
    }
    for (auto& [sandbox, why] : expired) {
        ++failures_[why == "timeout" ? "lifetime" : "idle"];
        remove(*sandbox, why);
    }
    if (store_) {
        const int64_t wall = std::chrono::duration_cast<std::chrono::seconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
        std::vector<std::string> past;
        for (const auto& [id, record] : store_->paused())
            if (record.retain_until <= wall && !resuming_.contains(id))
                past.push_back(id);
        for (const std::string& id : past)
            remove_paused(id, "paused past its retention (--paused-retention)");
    }
    for (auto& [pointer, vm] : vms_)
        vm.sandbox->kill_if_overdue(now);
    refill();
    sweep_timer_.arm(sweep_period);
}

std::shared_ptr<Sandbox> SandboxManager::find(const std::string& id)
{
    auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : vms_.at(it->second).sandbox;
}

std::optional<std::string> SandboxManager::ended_reason(const std::string& id) const
{
    auto it = ended_.find(id);
    return it == ended_.end() ? std::nullopt : std::optional<std::string>(it->second);
}

void SandboxManager::remember_end(const std::string& id, const std::string& reason)
{
    ended_[id] = reason;
    ended_order_.push_back(id);
    while (ended_order_.size() > ended_remembered) {
        ended_.erase(ended_order_.front());
        ended_order_.pop_front();
    }
}

std::vector<Sandbox*> SandboxManager::sandboxes()
{
    std::vector<Sandbox*> list;
    for (const auto& [id, sandbox] : by_id_)
        list.push_back(sandbox);
    return list;
}

void SandboxManager::remove(Sandbox& sandbox, const std::string& reason)
{
    by_id_.erase(sandbox.id());
    remember_end(sandbox.id(), reason);
    sandbox.stop(reason);
}

void SandboxManager::drain(std::chrono::milliseconds grace, std::function<void()> done)
{
    draining_ = true;
    drained_ = std::move(done);
    for (auto& [name, pool] : pools_) {
        for (Sandbox* sandbox : pool.warm)
            sandbox->stop("serve is shutting down");
        pool.warm.clear();
    }
    drain_timer_.arm(grace);
    check_drained();
}

void SandboxManager::check_drained()
{
    if (!draining_)
        return;
    const bool calls_running = std::any_of(by_id_.begin(), by_id_.end(),
                                           [](const auto& entry) { return entry.second->running_calls() > 0; });
    if (!calls_running || drain_grace_over_) {
        for (auto& [pointer, vm] : vms_)
            vm.sandbox->stop("serve is shutting down");
    }
    if (vms_.empty() && drained_) {
        auto done = std::move(drained_);
        drained_ = nullptr;
        done();
    }
}

SandboxManager::Pool& SandboxManager::restore_pool(const std::string& snapshot, const std::string& name)
{
    Pool& pool = restore_pools_[snapshot];
    pool.config.name = name;
    pool.config.episode_args = {"--snapshot", snapshot};
    return pool;
}

void SandboxManager::prune_restore_pool(Pool& pool)
{
    // One per snapshot ever forked from or resumed: kept only while a VM of it runs, or
    // serve's memory would grow with every fork and resume.
    for (const auto& [pointer, vm] : vms_)
        if (vm.pool == &pool)
            return;
    std::erase_if(restore_pools_, [&pool](const auto& entry) { return &entry.second == &pool; });
}

std::optional<Refusal> SandboxManager::admit_restores(unsigned count)
{
    if (!store_)
        return Refusal{ServiceError::unavailable, "this serve keeps no snapshots (it was started without --state-dir)",
                       std::nullopt};
    if (draining_)
        return Refusal{ServiceError::draining, "serve is shutting down", std::nullopt};
    if (live_vms() + count > config_.max_sandboxes)
        return Refusal{ServiceError::at_capacity,
                       fmt::format("{} VMs are running and {} more would pass --max-sandboxes {}", live_vms(), count,
                                   config_.max_sandboxes),
                       1};
    return below_memory_reserve(config_.mem_reserve_mib);
}

void SandboxManager::take_snapshot(Sandbox& sandbox, const std::string& kind,
                                   std::function<void(const std::string& path, const std::string& error)> done)
{
    std::string name;
    try {
        name = store_->new_name(kind, sandbox.id());
    } catch (const Error& e) {
        return done("", e.what());
    }
    const std::string outbox = vms_.at(&sandbox).outbox;
    const Json request{{"op", "snapshot"}, {"name", name}};
    sandbox.call(request, request,
                 CallHandlers{[](Json&&) {}, [this, name, outbox, done = std::move(done)](Json&& answer) {
                                  if (!answer.contains("snapshot") || !answer["snapshot"].is_object()) {
                                      const Json& error = answer.contains("error") ? answer["error"] : answer;
                                      return done("", error.is_object() ? error.value("message", error.dump())
                                                                        : error.dump());
                                  }
                                  const Json& said = answer["snapshot"]["path"];
                                  std::string taken;
                                  try {
                                      // Only the directory it was asked to write is taken,
                                      // whatever the answer names.
                                      taken = store_->take_from_outbox(outbox, name,
                                                                       said.is_string() ? said.get<std::string>() : "");
                                  } catch (const Error& e) {
                                      return done("", e.what());
                                  }
                                  done(taken, "");
                              }});
}

void SandboxManager::fork(Sandbox& parent, unsigned count, ForkDone done)
{
    if (auto refusal = admit_restores(count))
        return done({}, &*refusal);
    Sandbox::Settings base = parent.settings();
    base.id.clear();
    const std::string pool_name = parent.pool();
    take_snapshot(parent, "fork", [this, count, base, pool_name, done = std::move(done)](const std::string& path,
                                                                                       const std::string& error) {
        if (path.empty()) {
            const Refusal refusal{ServiceError::snapshot_failed, "the parent's live snapshot failed: " + error, std::nullopt};
            return done({}, &refusal);
        }
        if (auto refusal = admit_restores(count)) {
            store_->hold(path);
            store_->release(path);
            return done({}, &*refusal);
        }
        struct Batch {
            unsigned waiting;
            std::vector<std::weak_ptr<Sandbox>> children;
            std::optional<Refusal> refusal;
            ForkDone done;
        };
        auto batch = std::make_shared<Batch>(Batch{count, {}, std::nullopt, done});
        Pool& pool = restore_pool(path, pool_name);
        const auto requested = Sandbox::Clock::now();
        // Held from the start, so that a child failing before the others have started does
        // not take the snapshot with it.
        store_->hold(path);
        for (unsigned i = 0; i < count; ++i) {
            Vm* vm = nullptr;
            try {
                vm = &start_vm(pool, false);
            } catch (const Error& e) {
                batch->refusal = Refusal{ServiceError::start_failed, e.what(), std::nullopt};
                batch->waiting -= count - i;
                break;
            }
            store_->hold(path);
            vm->origin = path;
            vm->settings = base;
            vm->requested = requested;
            vm->waiting = [this, batch](Sandbox* sandbox, const Refusal* refusal) {
                if (sandbox)
                    batch->children.push_back(vms_.at(sandbox).sandbox);
                else if (!batch->refusal)
                    batch->refusal = *refusal;
                if (--batch->waiting > 0)
                    return;
                std::vector<Sandbox*> ready;
                for (const auto& weak : batch->children)
                    if (auto child = weak.lock(); child && !child->stopping())
                        ready.push_back(child.get());
                if (batch->refusal) {
                    for (Sandbox* child : ready)
                        remove(*child, "a sibling of its fork failed to start");
                    return batch->done({}, &*batch->refusal);
                }
                spdlog::info("forked {} sandboxes", ready.size());
                batch->done(ready, nullptr);
            };
        }
        store_->release(path);
        prune_restore_pool(pool);
        if (batch->waiting == 0) {
            std::vector<Sandbox*> none;
            batch->done(none, &*batch->refusal);
        }
    });
}

void SandboxManager::pause(Sandbox& sandbox, PauseDone done)
{
    if (!store_) {
        const Refusal refusal{ServiceError::unavailable, "this serve keeps no snapshots (it was started without --state-dir)",
                              std::nullopt};
        return done(nullptr, &refusal);
    }
    if (sandbox.running_calls() > 0) {
        const Refusal refusal{ServiceError::busy,
                              fmt::format("{} call(s) are running: a paused sandbox would lose their answers; pause "
                                          "between calls",
                                          sandbox.running_calls()),
                              std::nullopt};
        return done(nullptr, &refusal);
    }
    std::weak_ptr<Sandbox> weak = vms_.at(&sandbox).sandbox;
    take_snapshot(sandbox, "pause", [this, weak, done = std::move(done)](const std::string& path,
                                                                          const std::string& error) {
        auto s = weak.lock();
        const auto refuse = [&](ServiceError code, const std::string& message) {
            if (!path.empty()) {
                store_->hold(path);
                store_->release(path);
            }
            const Refusal refusal{code, message, std::nullopt};
            done(nullptr, &refusal);
        };
        if (path.empty())
            return refuse(ServiceError::snapshot_failed, "the sandbox's live snapshot failed: " + error);
        if (!s || s->stopping() || !by_id_.contains(s->id()))
            return refuse(ServiceError::ended, "the sandbox ended while it was being paused");
        const Sandbox::Settings& settings = s->settings();
        const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
        PausedSandbox record;
        record.id = settings.id;
        record.snapshot = path;
        record.pool = s->pool();
        record.timeout_s = settings.timeout.count();
        if (settings.idle_timeout)
            record.idle_timeout_s = settings.idle_timeout->count();
        record.env = settings.env;
        record.metadata = settings.metadata;
        record.paused_at = now;
        record.retain_until = now + config_.paused_retention.count();
        record.disk_bytes = SnapshotStore::stored_bytes(path);
        try {
            store_->add_paused(record);
        } catch (const Error& e) {
            return refuse(ServiceError::snapshot_failed, e.what());
        }
        remove(*s, "paused");
        spdlog::info("sandbox {} paused: {} bytes on disk", record.id, record.disk_bytes);
        done(&store_->paused().at(record.id), nullptr);
    });
}

void SandboxManager::resume(const std::string& id, CreateDone done)
{
    const PausedSandbox* record = find_paused(id);
    if (!record) {
        const Refusal refusal{ServiceError::not_found, fmt::format("no paused sandbox {}", id), std::nullopt};
        return done(nullptr, &refusal);
    }
    if (resuming_.contains(id)) {
        const Refusal refusal{ServiceError::resuming, fmt::format("sandbox {} is being resumed already", id), std::nullopt};
        return done(nullptr, &refusal);
    }
    if (auto refusal = admit_restores(1))
        return done(nullptr, &*refusal);
    Vm* vm = nullptr;
    Pool& pool = restore_pool(record->snapshot, record->pool);
    try {
        vm = &start_vm(pool, false);
    } catch (const Error& e) {
        prune_restore_pool(pool);
        const Refusal refusal{ServiceError::start_failed, e.what(), std::nullopt};
        return done(nullptr, &refusal);
    }
    store_->hold(record->snapshot);
    vm->origin = record->snapshot;
    vm->settings.id = id;
    vm->settings.timeout = std::chrono::seconds(record->timeout_s);
    if (record->idle_timeout_s)
        vm->settings.idle_timeout = std::chrono::seconds(*record->idle_timeout_s);
    vm->settings.env = record->env;
    vm->settings.metadata = record->metadata;
    vm->requested = Sandbox::Clock::now();
    resuming_.insert(id);
    vm->waiting = [this, id, done = std::move(done)](Sandbox* sandbox, const Refusal* refusal) {
        resuming_.erase(id);
        if (sandbox && deleted_while_resuming_.erase(id) > 0) {
            // Its DELETE was answered "deleted" (remove_paused): it must not run on.
            by_id_.erase(id);
            sandbox->stop("deleted");
            const Refusal deleted{ServiceError::ended, fmt::format("sandbox {} was deleted while it was being resumed", id),
                                  std::nullopt};
            return done(nullptr, &deleted);
        }
        deleted_while_resuming_.erase(id);
        if (sandbox) {
            store_->remove_paused(id);
            ended_.erase(id);
            spdlog::info("sandbox {} resumed", id);
        }
        done(sandbox, refusal);
    };
}

const PausedSandbox* SandboxManager::find_paused(const std::string& id) const
{
    if (!store_)
        return nullptr;
    auto it = store_->paused().find(id);
    return it == store_->paused().end() ? nullptr : &it->second;
}

std::vector<const PausedSandbox*> SandboxManager::paused() const
{
    std::vector<const PausedSandbox*> list;
    if (store_)
        for (const auto& [id, record] : store_->paused())
            list.push_back(&record);
    return list;
}

void SandboxManager::remove_paused(std::string id, const std::string& reason)
{
    if (!store_ || !store_->paused().contains(id))
        return;
    // A resume under way ends its VM when it is ready (resume's waiting).
    if (resuming_.contains(id))
        deleted_while_resuming_.insert(id);
    store_->remove_paused(id);
    remember_end(id, reason);
}

void SandboxManager::count_call(const Json& answer, double seconds)
{
    call_latency_.observe(seconds);
    if (answer.value("timed_out", false))
        ++failures_["timeout"];
    if (answer.value("oom_killed", false))
        ++failures_["oom"];
    if (answer.contains("error") && answer["error"].is_object() && answer["error"].value("code", "") == "vm_died")
        ++failures_["vm_died_call"];
    if (draining_)
        check_drained();
}

std::string SandboxManager::metrics_text() const
{
    MetricsText out;
    std::map<std::string, int> by_state{{"warm", 0}, {"starting", 0}, {"running", 0}, {"stopping", 0}};
    for (const auto& [pointer, vm] : vms_) {
        const Sandbox& s = *vm.sandbox;
        if (s.stopping())
            ++by_state["stopping"];
        else if (!s.ready())
            ++by_state["starting"];
        else if (s.assigned())
            ++by_state["running"];
        else
            ++by_state["warm"];
    }
    out.family("agentvm_sandboxes", "gauge", "VMs by state (warm: ready in a pool; running: handed out)");
    for (const auto& [state, count] : by_state)
        out.sample("agentvm_sandboxes", label("state", state), count);
    out.family("agentvm_pool_ready", "gauge", "warm VMs ready per pool");
    for (const auto& [name, pool] : pools_)
        out.sample("agentvm_pool_ready", label("pool", name), static_cast<double>(pool.warm.size()));
    out.family("agentvm_pool_target", "gauge", "warm VMs each pool keeps (--pool NAME=N)");
    for (const auto& [name, pool] : pools_)
        out.sample("agentvm_pool_target", label("pool", name), pool.config.target);
    out.family("agentvm_creates_total", "counter", "sandboxes created, by pool and path (warm: from the pool)");
    for (const auto& [name, pool] : pools_) {
        out.sample("agentvm_creates_total", label("pool", name) + "," + label("path", "warm"),
                   static_cast<double>(pool.created_warm));
        out.sample("agentvm_creates_total", label("pool", name) + "," + label("path", "cold"),
                   static_cast<double>(pool.created_cold));
    }
    out.family("agentvm_create_refusals_total", "counter", "creates refused, by error code");
    for (const char* code : {"at_capacity", "memory_reserve", "draining"})
        out.sample("agentvm_create_refusals_total", label("code", code),
                   refusals_.contains(code) ? static_cast<double>(refusals_.at(code)) : 0.0);
    out.family("agentvm_failures_total", "counter",
               "failures by kind: vm_died (a sandbox's VM ended by itself), vm_died_call (calls it failed), "
               "start_failed, timeout and oom (calls), lifetime and idle (sandboxes expired)");
    for (const char* kind : {"vm_died", "vm_died_call", "start_failed", "timeout", "oom", "lifetime", "idle"})
        out.sample("agentvm_failures_total", label("kind", kind),
                   failures_.contains(kind) ? static_cast<double>(failures_.at(kind)) : 0.0);
    out.family("agentvm_create_seconds", "histogram", "time from a create request to its sandbox being ready");
    out.histogram("agentvm_create_seconds", "", create_latency_);
    out.family("agentvm_call_seconds", "histogram", "time from a call request to its answer");
    out.histogram("agentvm_call_seconds", "", call_latency_);
    out.family("agentvm_host_memory_available_bytes", "gauge", "MemAvailable of the host");
    out.sample("agentvm_host_memory_available_bytes", "", static_cast<double>(host_available_mib()) * 1048576);
    out.family("agentvm_host_memory_reserve_bytes", "gauge", "memory serve leaves to the host (--mem-reserve)");
    out.sample("agentvm_host_memory_reserve_bytes", "", static_cast<double>(config_.mem_reserve_mib) * 1048576);
    return out.text();
}

} // namespace agentvm
