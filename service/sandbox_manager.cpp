#include "service/sandbox_manager.hpp"


#include <algorithm>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "common/share_with_vm.hpp"
#include "service/sandbox_ids.hpp"
#include "service/vm_users/vm_dir_sharing.hpp"
#include "service/vm_priority.hpp"

namespace agentvm {
namespace {

constexpr size_t ended_remembered = 4096;
constexpr auto sweep_period = std::chrono::milliseconds(250);

double seconds_since(Sandbox::Clock::time_point start)
{
    return std::chrono::duration<double>(Sandbox::Clock::now() - start).count();
}

// The config with its node and instance ids filled in where it left them empty.
ManagerConfig with_ids(ManagerConfig config)
{
    if (config.node_id.empty())
        config.node_id = default_node_id();
    else if (const std::string problem = node_id_problem(config.node_id); !problem.empty())
        throw Error(fmt::format("node id '{}': {}", config.node_id, problem));
    if (config.instance_id.empty())
        config.instance_id = new_instance_id();
    return config;
}

} // namespace

SandboxManager::SandboxManager(EventLoop& loop, ManagerConfig config, HostProbes probes)
    : loop_(loop), config_(with_ids(std::move(config))), probes_(std::move(probes)), cpu_weights_(cpu_weights_supported()),
      admission_(config_.max_sandboxes, config_.mem_reserve_mib, probes_.available_mib, [this] { return live_vms(); }),
      pools_(config_.pools, config_.refill_concurrency, config_.pool_warmup, admission_,
             [this](Pool& pool) { start_vm(pool, true); }, probes_.now),
      snapshots_(config_.state_dir, config_.paused_retention, *this, pools_, admission_),
      jail_ids_(config_.jail_ids ? std::optional<JailIds>(*config_.jail_ids) : std::nullopt),
      egress_(loop_, config_.egress_limits), bury_timer_(loop_, [this] { graveyard_.clear(); }), sweep_timer_(loop_, [this] { sweep(); }),
      drain_timer_(loop_, [this] {
          drain_grace_over_ = true;
          check_drained();
      })
{
    pools_.refill();
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

size_t SandboxManager::live_vms() const
{
    return static_cast<size_t>(std::count_if(vms_.begin(), vms_.end(),
                                             [](const auto& entry) { return !entry.second.sandbox->stopping(); }));
}

std::string SandboxManager::new_id() const
{
    for (;;) {
        std::string id = new_sandbox_id(config_.node_id, config_.instance_id);
        if (!by_id_.contains(id) && !ended_.contains(id))
            return id;
    }
}

SandboxManager::Vm& SandboxManager::start_vm(Pool& pool, bool for_pool)
{
    std::vector<std::string> args = pool.config.episode_args;
    // What is made for the VM below goes again if it cannot be started.
    std::string outbox;
    std::string socket_dir;
    std::optional<uint32_t> jail_id;
    const auto undo = [&] {
        snapshots_.remove_outbox(outbox);
        if (!socket_dir.empty())
            socket_dirs_.remove(socket_dir);
        if (jail_id)
            jail_ids_->give_back(*jail_id);
    };
    std::shared_ptr<Sandbox> sandbox;
    try {
        // Its VMM's own uid and gid: it reads no other VM's files and signals no other VMM.
        if (jail_ids_) {
            jail_id = jail_ids_->take();
            if (!jail_id)
                throw Error(fmt::format("every uid of --jail-uid-range ({}) belongs to a running VM",
                                        config_.jail_ids->count));
            const std::string id = std::to_string(*jail_id);
            args.insert(args.end(), {"--jail-uid", id, "--jail-gid", id});
        }
        // Each VM writes its live snapshots into a directory of its own, the only one its jail
        // keeps writable: a VMM a guest took over can write no other sandbox's snapshots.
        outbox = snapshots_.new_outbox();
        if (!outbox.empty()) {
            if (jail_id)
                share_with_vm(outbox, *jail_id, 0770);
            args.insert(args.end(), {"--snapshot-dir", outbox});
        }
        if (for_pool && cpu_weights_)
            args.insert(args.end(), {"--cpu-weight", std::to_string(pool_cpu_weight)});
        // Its guest's ports are reached through its VMM's end of vsock (service/ports/).
        socket_dir = socket_dirs_.make();
        if (jail_id)
            share_with_vm(socket_dir, *jail_id, 0770);
        args.insert(args.end(), {"--vsock-uds", GuestSocketDirs::socket_in(socket_dir)});
        sandbox = std::make_shared<Sandbox>(
            loop_, pool.config.name, config_.program, args, config_.history_limit,
            Sandbox::Hooks{[this](Sandbox& s, bool) { on_ready(s); },
                           [this](Sandbox& s, const std::string& why) { on_exit(s, why); },
                           [this](const Json& answer, std::chrono::duration<double> took) {
                               on_call_answered(answer, took.count());
                           }});
    } catch (const Error&) {
        undo();
        throw;
    }
    sandbox->set_guest_socket(GuestSocketDirs::socket_in(socket_dir));
    Sandbox* key = sandbox.get();
    Vm& vm = vms_[key];
    vm.sandbox = std::move(sandbox);
    vm.outbox = std::move(outbox);
    vm.socket_dir = std::move(socket_dir);
    vm.jail_id = jail_id;
    vm.pool = &pool;
    vm.refill = for_pool;
    vm.low_weight = for_pool && cpu_weights_;
    pools_.vm_started(pool);
    return vm;
}

void SandboxManager::start_for(Pool& pool, Sandbox::Settings settings, Sandbox::Clock::time_point requested,
                               SnapshotHold origin, CreateDone done)
{
    Vm& vm = start_vm(pool, false);
    vm.origin = std::move(origin);
    vm.settings = std::move(settings);
    vm.requested = requested;
    vm.waiting = std::move(done);
}

const std::string& SandboxManager::outbox_of(Sandbox& sandbox) const
{
    return vms_.at(&sandbox).outbox;
}

void SandboxManager::create(const std::string& pool_name, Sandbox::Settings settings, CreateDone done)
{
    const auto requested = Sandbox::Clock::now();
    Pool* pool = pools_.find(pool_name);
    if (!pool) {
        const Refusal refusal{ServiceError::unknown_pool,
                              fmt::format("no pool named \"{}\" (serve has: {})", pool_name,
                                          fmt::join(pools_.names(), ", ")),
                              std::nullopt};
        return done(nullptr, &refusal);
    }
    if (admission_.closed()) {
        metrics_.count_refusal(ServiceError::draining);
        const Refusal refusal = Admission::closed_refusal();
        return done(nullptr, &refusal);
    }
    if (Sandbox* sandbox = pools_.take_warm(*pool)) {
        hand_out(vms_.at(sandbox), std::move(settings), requested, true);
        done(sandbox, nullptr);
        pools_.refill();
        return;
    }
    if (auto refusal = admission_.admit_create([&] { return pools_.evict_spare(*pool); })) {
        metrics_.count_refusal(refusal->code);
        return done(nullptr, &*refusal);
    }
    try {
        start_for(*pool, std::move(settings), requested, SnapshotHold(), std::move(done));
    } catch (const Error& e) {
        metrics_.count_failure("start_failed");
        ++pool->starts_failed_in_row;
        pool->last_start_failure = probes_.now();
        const Refusal refusal{ServiceError::start_failed, e.what(), std::nullopt};
        return done(nullptr, &refusal);
    }
}

void SandboxManager::hand_out(Vm& vm, Sandbox::Settings settings, Sandbox::Clock::time_point requested, bool warm)
{
    if (settings.id.empty())  // a resumed sandbox keeps its id
        settings.id = new_id();
    settings.warm = warm;
    settings.create_time = std::chrono::duration_cast<std::chrono::milliseconds>(Sandbox::Clock::now() - requested);
    metrics_.observe_create(seconds_since(requested));
    ++(warm ? vm.pool->created_warm : vm.pool->created_cold);
    vm.refill = false;
    if (vm.low_weight) {
        restore_cpu_weight(vm.sandbox->pid());
        vm.low_weight = false;
    }
    by_id_[settings.id] = vm.sandbox.get();
    open_egress(vm, settings);
    vm.sandbox->assign(std::move(settings));
    spdlog::info("sandbox {} created ({}, pool {})", vm.sandbox->id(), warm ? "warm" : "cold", vm.pool->config.name);
}

const EgressRules& SandboxManager::default_egress(const std::string& pool) const
{
    for (const PoolConfig& config : config_.pools)
        if (config.name == pool && config.egress)
            return *config.egress;
    return config_.egress_default;
}

void SandboxManager::open_egress(Vm& vm, Sandbox::Settings& settings)
{
    Sandbox& sandbox = *vm.sandbox;
    const EgressRules& rules = settings.egress ? *settings.egress : default_egress(vm.pool->config.name);
    if (rules.allow.empty() || sandbox.guest_socket().empty())
        return;
    EgressPolicy policy = EgressPolicy::parse(rules.allow, rules.deny);  // checked when given
    if (!policy.allows_any())
        return;
    try {
        open_egress_proxy(vm, std::move(policy));
    } catch (const Error& e) {
        // The sandbox goes on without it: its tools get the agent's "no egress" answer.
        spdlog::error("sandbox {}: no egress proxy: {}", settings.id, e.what());
        return;
    }
    for (auto& [name, value] : egress_proxy_env())
        settings.env.try_emplace(name, value);  // the user's own setting wins
}

void SandboxManager::open_egress_proxy(Vm& vm, EgressPolicy policy)
{
    egress_.open(*vm.sandbox, std::move(policy));
    if (vm.jail_id) {
        try {
            share_with_vm(EgressProxy::socket_for(vm.sandbox->guest_socket()), *vm.jail_id, 0660);
        } catch (const Error&) {
            egress_.close(*vm.sandbox);
            throw;
        }
    }
}

void SandboxManager::change_egress(Sandbox& sandbox, EgressRules rules)
{
    EgressPolicy policy = EgressPolicy::parse(rules.allow, rules.deny);  // checked when given
    std::map<std::string, std::string> env;
    if (!policy.allows_any() || sandbox.guest_socket().empty()) {
        egress_.close(sandbox);
    } else if (EgressProxy* proxy = egress_.find(sandbox)) {
        proxy->set_policy(std::move(policy));
    } else {
        open_egress_proxy(vms_.at(&sandbox), std::move(policy));
        env = egress_proxy_env();
    }
    sandbox.change_egress(std::move(rules), env);
}

void SandboxManager::on_ready(Sandbox& sandbox)
{
    Vm& vm = vms_.at(&sandbox);
    vm.pool->starts_failed_in_row = 0;
    if (vm.refill)
        return pools_.refill_ready(*vm.pool, vm.sandbox);
    CreateDone done = std::exchange(vm.waiting, nullptr);
    hand_out(vm, std::move(vm.settings), vm.requested, false);
    done(&sandbox, nullptr);
}

void SandboxManager::on_exit(Sandbox& sandbox, const std::string& why)
{
    auto node = vms_.extract(&sandbox);
    Vm& vm = node.mapped();
    Pool& pool = *vm.pool;
    if (!sandbox.ready()) {
        metrics_.count_failure("start_failed");
        spdlog::error("pool {}: a VM failed to start: {}", pool.config.name, why);
        ++pool.starts_failed_in_row;
        pool.last_start_failure = probes_.now();
        if (vm.refill)
            pools_.refill_failed(pool);
        if (vm.waiting) {
            const Refusal refusal{ServiceError::start_failed, "the sandbox's VM did not start: " + why, std::nullopt};
            vm.waiting(nullptr, &refusal);
        }
    }
    pools_.vm_ended(pool, sandbox);
    if (sandbox.assigned()) {
        if (auto it = by_id_.find(sandbox.id()); it != by_id_.end()) {
            // Not removed by anyone: the VM died under its user.
            by_id_.erase(it);
            metrics_.count_failure("vm_died");
            remember_end(sandbox.id(), "vm_died: " + why);
        }
    }
    egress_.close(sandbox);
    snapshots_.remove_outbox(vm.outbox);
    socket_dirs_.remove(vm.socket_dir);
    if (vm.jail_id)
        jail_ids_->give_back(*vm.jail_id);
    graveyard_.push_back(std::move(vm.sandbox));
    bury_timer_.arm(std::chrono::nanoseconds(1));
    if (admission_.closed())
        check_drained();
    else
        pools_.refill();
}

void SandboxManager::on_call_answered(const Json& answer, double seconds)
{
    metrics_.count_call(answer, seconds);
    if (admission_.closed())
        check_drained();
}

void SandboxManager::sweep()
{
    const auto now = probes_.now();
    std::vector<std::pair<Sandbox*, std::string>> expired;
    for (const auto& [id, sandbox] : by_id_) {
        if (auto why = sandbox->expired(now))
            expired.emplace_back(sandbox, *why);
    }
    for (auto& [sandbox, why] : expired)
        expire(*sandbox, why);
    snapshots_.expire_paused(probes_.wall_now());
    for (auto& [pointer, vm] : vms_)
        vm.sandbox->kill_if_overdue(now);
    pools_.refill();
    sweep_timer_.arm(sweep_period);
}

void SandboxManager::expire(Sandbox& sandbox, const std::string& why)
{
    if (why != "timeout" || !sandbox.settings().pause_on_timeout || config_.state_dir.empty()) {
        metrics_.count_failure(why == "timeout" ? "lifetime" : "idle");
        return remove(sandbox, why);
    }
    // Expired on every sweep until its pause ends it: one pause at a time.
    if (!auto_pausing_.insert(sandbox.id()).second)
        return;
    std::weak_ptr<Sandbox> weak = find(sandbox.id());
    // Its calls end with it, as E2B's auto-pause cuts the sandbox's connections.
    pause(
        sandbox,
        [this, weak, id = sandbox.id()](const PausedSandbox* paused, const Refusal* refusal) {
            auto_pausing_.erase(id);
            if (paused)
                return spdlog::info("sandbox {} paused at its timeout", id);
            spdlog::warn("sandbox {}: its pause at its timeout failed, so it ends: {}", id, refusal->message);
            metrics_.count_failure("lifetime");
            if (auto s = weak.lock(); s && !s->stopping() && find(id) == s)
                remove(*s, "timeout (its pause failed: " + refusal->message + ")");
        },
        true);
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
    egress_.close(sandbox);  // its connections out end with it, not with its VM's last breath
    sandbox.stop(reason);
}

void SandboxManager::drain(std::chrono::milliseconds grace, std::function<void()> done)
{
    admission_.close();
    drained_ = std::move(done);
    pools_.drain();
    drain_timer_.arm(grace);
    check_drained();
}

void SandboxManager::check_drained()
{
    if (!admission_.closed())
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

CapacityInputs SandboxManager::capacity_inputs() const
{
    CapacityInputs in;
    in.node_id = config_.node_id;
    in.draining = admission_.closed();
    in.running = live_vms();
    in.max_sandboxes = config_.max_sandboxes;
    in.reserve_mib = admission_.reserve_mib();
    try {
        in.available_mib = admission_.available_mib();
    } catch (const Error&) {
        in.available_mib = 0;  // unreadable: admission refuses every cold start too
    }
    for (const auto& [name, pool] : pools_.configured()) {
        in.warm += static_cast<unsigned>(
            std::count_if(pool.warm.begin(), pool.warm.end(), [](const Sandbox* s) { return !s->stopping(); }));
        in.warm_target += pool.config.target;
        in.pools.push_back(PoolStarts{name, pool.starts_failed_in_row, pool.last_start_failure});
    }
    in.now = probes_.now();
    return in;
}

std::string SandboxManager::metrics_text() const
{
    std::vector<const Sandbox*> vms;
    for (const auto& [pointer, vm] : vms_)
        vms.push_back(vm.sandbox.get());
    MetricsText egress;
    egress_.write_metrics(egress);
    return metrics_.text(vms, pools_.configured(), admission_.available_mib(), admission_.reserve_mib())
         + egress.text();
}

} // namespace agentvm
