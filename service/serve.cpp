#include "service/serve.hpp"

#include <signal.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/fd.hpp"
#include "common/whole_number.hpp"
#include "core/event_loop.hpp"
#include "core/loop_timer.hpp"
#include "service/fleet/agent_check_listener.hpp"
#include "service/fleet/peer_fetcher.hpp"
#include "service/served_apis.hpp"
#include "service/http_server.hpp"
#include "templates/template_store.hpp"

namespace agentvm {

PoolConfig parse_pool_spec(const std::string& text, const std::string& template_store)
{
    const size_t equals = text.rfind('=');
    if (equals == std::string::npos || equals == 0)
        throw Error(fmt::format("--pool {}: expected NAME=N (NAME: default, a snapshot directory or a template)", text));
    PoolConfig pool;
    pool.name = text.substr(0, equals);
    const std::string count = text.substr(equals + 1);
    const std::optional<unsigned> target = whole_number<unsigned>(count);
    if (!target || *target > 10000)
        throw Error(fmt::format("--pool {}: N must be a whole number from 0 to 10000", text));
    pool.target = *target;
    if (pool.name == "default")
        return pool;
    if (pool.name.find('/') != std::string::npos) {
        if (!std::filesystem::is_regular_file(std::filesystem::path(pool.name) / "manifest.json"))
            throw Error(fmt::format("--pool {}: {} is not a snapshot directory (no manifest.json; make one with "
                                    "agentvm snapshot bake)", text, pool.name));
        pool.episode_args = {"--snapshot", pool.name};
        return pool;
    }
    const TemplateStore store(TemplateStore::root_from(template_store));
    const auto manifest = store.read(pool.name);  // checks the name
    if (!manifest)
        throw Error(fmt::format("--pool {}: no template '{}' in '{}' (and a snapshot directory is named by a path "
                                "with a '/')", text, pool.name, store.root().string()));
    if (!store.baked(pool.name, *manifest))
        spdlog::warn("--pool {}: template '{}' is not baked (agentvm template bake {}): its VMs will boot cold", text,
                     pool.name, pool.name);
    pool.episode_args = {"--template", pool.name, "--template-store", store.root().string()};
    return pool;
}

namespace {

// Runs the loop until it is stopped. An exception from a callback (a handler's bug the
// per-request guards did not catch) fails what that callback was doing and is logged; serve and
// every other sandbox go on: the loop consumes each event before its callback, so it can run
// again. Only a loop that fails over and over (its ring broken) ends serve.
void run_loop(EventLoop& loop)
{
    constexpr int max_failures_per_second = 100;
    int failures = 0;
    auto window = std::chrono::steady_clock::now();
    for (;;) {
        try {
            loop.run();
            return;
        } catch (const std::exception& e) {
            const auto now = std::chrono::steady_clock::now();
            if (now - window >= std::chrono::seconds(1)) {
                window = now;
                failures = 0;
            }
            if (++failures >= max_failures_per_second)
                throw;
            spdlog::error("an event-loop callback failed: {}; serve goes on", e.what());
        }
    }
}

// The Unix socket files serve made, removed however serve ends: a socket file left by a serve
// that failed to start (a locked --state-dir, say) would look to a waiting client like a serve
// that is up, and answer it ECONNREFUSED.
struct SocketFiles {
    std::vector<std::string> paths;
    SocketFiles() = default;
    SocketFiles(const SocketFiles&) = delete;
    SocketFiles& operator=(const SocketFiles&) = delete;
    ~SocketFiles()
    {
        for (const std::string& path : paths)
            ::unlink(path.c_str());
    }
};

// Descriptors serve holds besides its connections and its VMs: the listeners, the event
// loop's ring and eventfd, MHD's epoll fd and ITC per listener, the timers, the signalfd, the
// log, the state directory's lock, and a file or two being read, with room to spare.
constexpr rlim_t fixed_fds = 64;
// Each VM costs serve 4 while it runs (EpisodeProcess: its pidfd and its stdin, stdout and
// stderr pipes), 3 more while it starts (the child's ends of those pipes), and a snapshot's
// files while one is taken or read: 8 leaves room for all of them.
constexpr rlim_t fds_per_vm = 8;
// Connections at most, whatever the descriptor limit: at MHD's 16 KiB each, 128 MiB.
constexpr rlim_t max_connections_cap = 8192;
// A client address gets at most this share of its listener's connections.
constexpr unsigned per_address_share = 4;
// How long requests still open when serve stops get to take their answers.
constexpr auto finish_patience = std::chrono::seconds(2);

// Raises the soft descriptor limit as far as serve can use it (a default soft limit of 1024
// would run out long before MHD's connection limit) and returns how many connections fit
// beside every VM --max-sandboxes allows, so that no flood of clients can leave serve without
// a descriptor for a VM's pipes, a snapshot or /proc/meminfo.
unsigned connection_budget(unsigned max_sandboxes)
{
    const rlim_t reserve = fixed_fds + fds_per_vm * max_sandboxes;
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) != 0)
        throw_errno("getrlimit(RLIMIT_NOFILE)");
    const rlim_t wanted = reserve + max_connections_cap;
    if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < wanted) {
        rlimit raised = limit;
        raised.rlim_cur = limit.rlim_max == RLIM_INFINITY ? wanted : std::min(wanted, limit.rlim_max);
        if (raised.rlim_cur > limit.rlim_cur && ::setrlimit(RLIMIT_NOFILE, &raised) == 0)
            limit = raised;
    }
    const rlim_t soft = limit.rlim_cur == RLIM_INFINITY ? wanted : limit.rlim_cur;
    if (soft < reserve + 64) {
        const rlim_t fallback = std::max<rlim_t>(16, soft / 4);
        spdlog::warn("the descriptor limit is {} (hard limit {}): {} VMs (--max-sandboxes) need {} of them, which "
                     "leaves too few for clients; taking {} connections at most. Raise the limit (ulimit -n, "
                     "LimitNOFILE=) or lower --max-sandboxes",
                     soft, limit.rlim_max, max_sandboxes, reserve, fallback);
        return static_cast<unsigned>(fallback);
    }
    return static_cast<unsigned>(std::min(soft - reserve, max_connections_cap));
}

} // namespace

int run_serve(const ServeConfig& config)
{
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    for (int signal : {SIGINT, SIGTERM, SIGHUP})
        sigaddset(&stop_signals, signal);
    if (::sigprocmask(SIG_BLOCK, &stop_signals, nullptr) != 0)
        throw_errno("blocking the stop signals");
    Fd signals(::signalfd(-1, &stop_signals, SFD_CLOEXEC | SFD_NONBLOCK));
    if (!signals)
        throw_errno("signalfd");

    std::vector<Fd> listeners;
    SocketFiles socket_files;
    for (const ListenSpec& spec : config.listen) {
        if (spec.inherited_fd >= 0) {
            // systemd made it and keeps its file, across serve's restarts too.
            listeners.emplace_back(spec.inherited_fd);
            continue;
        }
        listeners.push_back(spec.tcp ? listen_tcp(spec.host, spec.port) : listen_unix(spec.path));
        if (!spec.tcp)
            socket_files.paths.push_back(spec.path);
    }

    Fd agent_check_socket;
    if (config.agent_check) {
        if (!config.agent_check->tcp)
            throw Error(fmt::format("--agent-check {}: HAProxy's agent check speaks TCP: give tcp:HOST:PORT",
                                    config.agent_check->text()));
        try {
            agent_check_socket = config.agent_check->inherited_fd >= 0
                                     ? Fd(config.agent_check->inherited_fd)
                                     : listen_tcp(config.agent_check->host, config.agent_check->port);
        } catch (const Error& e) {
            throw Error(fmt::format("--agent-check: {}", e.what()));
        }
    }

    EventLoop loop;
    SandboxManager manager(loop, config.sandboxes);
    // Answers until serve ends, draining included: the balancer hears "drain" while the HTTP
    // listeners are already closed.
    std::optional<AgentCheckListener> agent_check;
    if (agent_check_socket)
        agent_check.emplace(loop, std::move(agent_check_socket),
                            [&manager] { return capacity_report(manager.capacity_inputs()).agent_line(); });
    // The peers' lists are asked for on this loop (peer_fetcher.hpp); none when this node is alone.
    std::optional<PeerFetcher> peers;
    if (std::vector<Peer> others = peers_besides(config.peers, manager.config().node_id); !others.empty()) {
        for (const Peer& peer : others)
            spdlog::info("fleet lists include node {} at {}", peer.node, peer.url);
        peers.emplace(loop, std::move(others));
    }
    ServedApis apis(manager, config.token, peers ? &*peers : nullptr);
    HttpServer::Options options;
    options.admit = [&apis](HttpExchange& head) { return apis.admit(head); };
    options.max_connections = connection_budget(config.sandboxes.max_sandboxes);
    const unsigned listener_share = std::max(1u, options.max_connections / static_cast<unsigned>(listeners.size()));
    options.max_connections_per_address = std::max(1u, listener_share / per_address_share);
    HttpServer server(loop, std::move(listeners), options);
    int stop_signal = 0;
    bool stopping_now = false;
    // A VM that outlives even its SIGKILL (Sandbox::stop_patience) does not hold serve up.
    LoopTimer give_up(loop, [&loop] {
        spdlog::error("VMs are still ending long after they were told to: stopping without them");
        loop.stop();
    });
    loop.watch_readable(signals.get(), [&] {
        signalfd_siginfo info{};
        if (::read(signals.get(), &info, sizeof info) != sizeof info)
            return;
        if (stop_signal != 0) {
            if (stopping_now) {
                spdlog::warn("{} again: stopping without waiting for the VMs",
                             strsignal(static_cast<int>(info.ssi_signo)));
                loop.stop();
                return;
            }
            // Every VM is stopped now rather than after the grace; their calls are answered
            // (stopped, vm_died) as they end, and serve ends once the last has.
            stopping_now = true;
            spdlog::warn("{} again: stopping every VM now", strsignal(static_cast<int>(info.ssi_signo)));
            server.stop_accepting();
            manager.drain(std::chrono::milliseconds(0), [&loop] { loop.stop(); });
            give_up.arm(Sandbox::stop_patience + std::chrono::seconds(5));
            return;
        }
        stop_signal = static_cast<int>(info.ssi_signo);
        spdlog::info("{}: draining (running calls have {} s to finish)", strsignal(stop_signal),
                     config.drain_grace.count());
        if (config.notifier)
            config.notifier->notify(fmt::format("STOPPING=1\nSTATUS=draining after {}: running calls have {} s to "
                                                "finish", strsignal(stop_signal), config.drain_grace.count()));
        server.stop_accepting();
        manager.drain(config.drain_grace, [&loop] { loop.stop(); });
    });
    for (const ListenSpec& spec : config.listen)
        spdlog::info("serving on {}{}", spec.text(), config.token ? " (token required)" : "");
    if (config.agent_check)
        spdlog::info("HAProxy agent check on {}", config.agent_check->text());
    spdlog::info("connections: at most {} per listener, {} per client address on TCP; request headers due within "
                 "{} s",
                 listener_share, options.max_connections_per_address, options.header_timeout.count());
    if (config.notifier) {
        std::string where;
        for (const ListenSpec& spec : config.listen)
            where += (where.empty() ? "" : ", ") + spec.text();
        config.notifier->notify(fmt::format("READY=1\nSTATUS=serving on {}", where));
    }
    run_loop(loop);
    // The VMs have ended, so every call has its answer: each request still open gets its
    // own (503 for one that had none) before the HTTP server goes, and a little time to take it.
    bool lingering = false;
    bool finished = false;
    server.finish_requests([&] {
        finished = true;
        if (lingering)
            loop.stop();
    });
    if (!finished) {
        lingering = true;
        LoopTimer linger(loop, [&loop] { loop.stop(); });
        linger.arm(finish_patience);
        run_loop(loop);
    }
    loop.unwatch(signals.get());
    spdlog::info("stopped by {}", strsignal(stop_signal));
    return 0;
}

} // namespace agentvm
