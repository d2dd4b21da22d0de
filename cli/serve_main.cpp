// agentvm-serve: what `agentvm serve` runs (docs/api.md). A program of its own: libmicrohttpd
// can only be linked dynamically here (Debian ships no static p11-kit or libunistring, which
// its gnutls needs), while agentvm, which runs every VMM, stays static for its start time.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <sys/stat.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "episode/exit_codes.hpp"
#include "cli/logging.hpp"
#include "common/error.hpp"
#include "service/egress/egress_policy.hpp"
#include "service/serve.hpp"
#include "service/systemd/delegated_cgroup.hpp"
#include "service/systemd/listen_fds.hpp"
#include "service/vm_users/jail_ids.hpp"
#include "service/vm_users/subordinate_ids.hpp"

namespace {

using namespace agentvm;

std::string read_token(const std::string& path)
{
    std::ifstream file(path, std::ios::binary);
    if (!file)
        throw Error(fmt::format("--token-file {}: cannot be read", path));
    std::ostringstream text;
    text << file.rdbuf();
    std::string token = text.str();
    while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' '))
        token.pop_back();
    if (token.empty())
        throw Error(fmt::format("--token-file {}: the file is empty", path));
    if (token.find_first_of(" \t\r\n:") != std::string::npos)
        throw Error(fmt::format("--token-file {}: the token must be one word without ':'", path));
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0)
        spdlog::warn("--token-file {} can be read by other users (mode {:o}); chmod 600 it", path, st.st_mode & 0777);
    return token;
}

// --pool-egress-allow/--pool-egress-deny POOL=RULE into that pool's own rules, checked.
void add_pool_egress(std::vector<PoolConfig>& pools, const std::vector<std::string>& allow,
                     const std::vector<std::string>& deny)
{
    for (const auto* list : {&allow, &deny}) {
        const char* flag = list == &allow ? "--pool-egress-allow" : "--pool-egress-deny";
        for (const std::string& text : *list) {
            const size_t equals = text.find('=');
            const std::string name = text.substr(0, equals);
            auto pool = std::find_if(pools.begin(), pools.end(), [&](const PoolConfig& p) { return p.name == name; });
            if (equals == std::string::npos || pool == pools.end())
                throw Error(fmt::format("{} {}: expected POOL=RULE, POOL one of the --pool names", flag, text));
            if (!pool->egress)
                pool->egress.emplace();
            (list == &allow ? pool->egress->allow : pool->egress->deny).push_back(text.substr(equals + 1));
        }
    }
    for (const PoolConfig& pool : pools) {
        if (!pool.egress)
            continue;
        try {
            EgressPolicy::parse(pool.egress->allow, pool.egress->deny);
        } catch (const Error& e) {
            throw Error(fmt::format("--pool-egress-allow/--pool-egress-deny {}: {}", pool.name, e.what()));
        }
    }
}

std::string default_socket()
{
    if (::geteuid() == 0) {
        ::mkdir("/run/agentvm", 0700);
        return "/run/agentvm/serve.sock";
    }
    if (const char* runtime = std::getenv("XDG_RUNTIME_DIR"); runtime && *runtime)
        return std::string(runtime) + "/agentvm-serve.sock";
    throw Error("no default socket for a non-root user without XDG_RUNTIME_DIR: give --listen unix:PATH");
}

} // namespace

int main(int argc, char** argv)
{
    std::signal(SIGPIPE, SIG_IGN);
    CLI::App app{"agentvm serve: the per-host sandbox service (HTTP API, docs/api.md)"};
    app.name("agentvm serve");
    std::vector<std::string> listen;
    std::string token_file;
    bool no_auth = false;
    std::string log_level = "info";
    std::vector<std::string> pools;
    std::string template_store;
    ServeConfig config;
    unsigned drain_grace_s = 30;
    app.add_option("--listen", listen,
                   "unix:PATH (mode 0600) or tcp:HOST:PORT, repeatable (default: unix:/run/agentvm/serve.sock "
                   "as root)");
    app.add_option("--token-file", token_file, "file holding the token every request must carry");
    app.add_option("--node-id", config.sandboxes.node_id,
                   "what every sandbox id starts with, so that a router in front of many hosts finds a sandbox's "
                   "host from its id: 1-32 of a-z, 0-9 and '-' (default: the host's short name)");
    app.add_option("--e2b-domain", config.sandboxes.e2b_domain,
                   "the E2B facade's sandbox domain: a request whose Host is <port>-<sandbox id>.<domain> is that "
                   "sandbox's port, as E2B's getHost(port) names it (point a wildcard DNS name at serve)");
    app.add_flag("--no-auth", no_auth, "allow a TCP listener without a token (loopback addresses only)");
    app.add_option("--pool", pools,
                   "NAME=N: keep N VMs of a snapshot ready (NAME: default, set-up's snapshot; a snapshot "
                   "directory; or a template, agentvm template); repeatable (default: default=2)");
    app.add_option("--template-store", template_store,
                   "where --pool's templates are (default: AGENTVM_TEMPLATES, else /var/lib/agentvm/templates)");
    app.add_option("--max-sandboxes", config.sandboxes.max_sandboxes,
                   "VMs serve runs at most, warm ones included; a create past it is answered 429")
        ->capture_default_str()
        ->check(CLI::Range(1u, 100000u));
    app.add_option("--mem-reserve", config.sandboxes.mem_reserve_mib,
                   "MiB of host memory (MemAvailable) no VM start may eat into; a create that would is answered 503")
        ->capture_default_str();
    app.add_option("--pool-refill", config.sandboxes.refill_concurrency, "VM starts a pool refill runs at once")
        ->capture_default_str()
        ->check(CLI::Range(1u, 256u));
    app.add_flag("--pool-warmup", config.sandboxes.pool_warmup,
                 "run one call in each pool VM before it counts as ready: faster first calls, a little more "
                 "memory per warm VM");
    config.sandboxes.state_dir = "/var/lib/agentvm/serve";
    app.add_option("--state-dir", config.sandboxes.state_dir,
                   "where live snapshots and paused sandboxes are kept, across restarts (one serve per directory)")
        ->capture_default_str();
    double paused_retention_s = static_cast<double>(config.sandboxes.paused_retention.count());
    app.add_option("--paused-retention", paused_retention_s, "seconds a paused sandbox is kept before it is removed")
        ->capture_default_str()
        ->check(CLI::Range(1.0, 10.0 * 365 * 86400));
    app.add_option("--history", config.sandboxes.history_limit, "calls each sandbox's history keeps (the latest)")
        ->capture_default_str()
        ->check(CLI::Range(1u, 100000u));
    app.add_option("--fusion-fetch-max", config.sandboxes.fusion_fetch_max,
                   "bytes of fetch_files one /run_code or /run_jupyter request brings back, all files together; "
                   "past it the answer is SandboxError")
        ->capture_default_str()
        ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 30));
    app.add_option("--fusion-output-max", config.sandboxes.fusion_output_max,
                   "bytes of each output stream a /run_code run, or all the cells of a /run_jupyter request, keep")
        ->capture_default_str()
        ->check(CLI::Range(uint64_t{0}, uint64_t{EpisodeProcess::max_output_limit}));
    app.add_option("--drain-grace", drain_grace_s,
                   "seconds running calls may take to finish after SIGTERM before their VMs are stopped")
        ->capture_default_str()
        ->check(CLI::Range(0u, 86400u));
    std::string agent_check;
    app.add_option("--agent-check", agent_check,
                   "tcp:HOST:PORT: answer HAProxy's agent check there with this node's state and free capacity "
                   "(\"ready up N%\", \"drain\" or \"maint\"; docs/api.md)");
    std::vector<std::string> peer_specs;
    std::string peers_file;
    app.add_option("--peer", peer_specs,
                   "NODE=http://HOST:PORT: another node of the fleet, whose sandboxes this node's lists include "
                   "(docs/api.md, \"Listing across a fleet\"); repeatable; the one named by --node-id is skipped, so every node may get the "
                   "same list");
    app.add_option("--peers-file", peers_file, "a file of --peer entries, one NODE=URL a line, # comments");
    app.add_option("--egress-allow", config.sandboxes.egress_default.allow,
                   "RULE: where sandboxes whose create names no egress may connect out, through the proxy on "
                   "their 127.0.0.1:3128 (HOST[:PORTS]: a name, *.domain, an IP or CIDR range, or *; docs/api.md, "
                   "\"Egress\"); repeatable (default: nowhere)");
    app.add_option("--egress-deny", config.sandboxes.egress_default.deny,
                   "RULE: where they may not, even when an allow rule matches; repeatable");
    std::vector<std::string> pool_egress_allow;
    std::vector<std::string> pool_egress_deny;
    app.add_option("--pool-egress-allow", pool_egress_allow,
                   "POOL=RULE: an allow rule of that --pool's own default, which its sandboxes get instead of "
                   "--egress-allow/--egress-deny when their create names no egress; repeatable")
        ->allow_extra_args(false);
    app.add_option("--pool-egress-deny", pool_egress_deny, "POOL=RULE: a deny rule of that pool's own default")
        ->allow_extra_args(false);
    app.add_option("--egress-max-connections", config.sandboxes.egress_limits.max_connections,
                   "connections out each sandbox may have open at once; past it the proxy answers 429")
        ->capture_default_str()
        ->check(CLI::Range(size_t{1}, size_t{65536}));
    app.add_option("--egress-max-bytes", config.sandboxes.egress_limits.max_bytes,
                   "bytes each sandbox may move through its egress proxy over its life, both ways; past it its "
                   "connections are cut and new ones answered 429")
        ->capture_default_str()
        ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 50));
    std::string jail_uid_range =
        fmt::format("{}:{}", default_jail_id_range.first, default_jail_id_range.count);
    app.add_option("--jail-uid-range", jail_uid_range,
                   "FIRST:COUNT: the uids each VMM runs as, one of its own per running VM (its gid the same "
                   "number), so that a VMM a guest took over reads no other VM's files; none: VMMs keep serve's "
                   "uid")
        ->capture_default_str();
    bool delegated_cgroup = false;
    app.add_flag("--delegated-cgroup", delegated_cgroup,
                 "make the VMs' cgroups inside serve's own, which systemd delegated to it (Delegate=yes): serve "
                 "moves itself into a leaf of it (cgroup v2; nothing to do on v1)");
    app.add_option("--log-level", log_level, "trace, debug, info, warn, error, critical or off")->capture_default_str();
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : exit_code::usage;
    }
    try {
        setup_logging(log_level);
        config.drain_grace = std::chrono::seconds(drain_grace_s);
        config.sandboxes.paused_retention = std::chrono::seconds(static_cast<int64_t>(paused_retention_s));
        if (config.sandboxes.state_dir.empty())
            throw Error("--state-dir must name a directory");
        config.sandboxes.state_dir = std::filesystem::absolute(config.sandboxes.state_dir).lexically_normal().string();
        config.sandboxes.program = (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "agentvm").string();
        if (pools.empty())
            pools.push_back("default=2");
        for (const std::string& text : pools) {
            PoolConfig pool = parse_pool_spec(text, template_store);
            for (const PoolConfig& other : config.sandboxes.pools)
                if (other.name == pool.name)
                    throw Error(fmt::format("--pool {}: the pool {} is given twice", text, pool.name));
            config.sandboxes.pools.push_back(std::move(pool));
        }
        config.sandboxes.jail_ids = parse_jail_id_range(jail_uid_range);
        if (config.sandboxes.jail_ids) {
            check_jail_id_privileges();
            check_no_accounts_in(*config.sandboxes.jail_ids);
            check_no_subordinate_ids_in(*config.sandboxes.jail_ids, "/etc/subuid");
            check_no_subordinate_ids_in(*config.sandboxes.jail_ids, "/etc/subgid");
        }
        if (delegated_cgroup)
            enter_delegated_cgroup();
        config.notifier = SystemdNotifier::from_environment();
        // Socket activation (deploy/systemd/agentvm-serve.socket): systemd's sockets beside --listen's.
        for (InheritedSocket& socket : take_inherited_sockets())
            config.listen.push_back(std::move(socket.spec));
        if (listen.empty() && config.listen.empty())
            listen.push_back("unix:" + default_socket());
        for (const std::string& text : listen)
            config.listen.push_back(parse_listen_spec(text));
        if (!agent_check.empty()) {
            config.agent_check = parse_listen_spec(agent_check);
            if (!config.agent_check->tcp)
                throw Error(fmt::format("--agent-check {}: HAProxy's agent check speaks TCP: give tcp:HOST:PORT",
                                        agent_check));
        }
        try {
            EgressPolicy::parse(config.sandboxes.egress_default.allow, config.sandboxes.egress_default.deny);
        } catch (const Error& e) {
            throw Error(fmt::format("--egress-allow/--egress-deny: {}", e.what()));
        }
        add_pool_egress(config.sandboxes.pools, pool_egress_allow, pool_egress_deny);
        if (!token_file.empty())
            config.token = read_token(token_file);
        for (const std::string& text : peer_specs) {
            try {
                config.peers.push_back(parse_peer(text));
            } catch (const Error& e) {
                throw Error(fmt::format("--peer: {}", e.what()));
            }
        }
        if (!peers_file.empty())
            for (Peer& peer : read_peers_file(peers_file))
                config.peers.push_back(std::move(peer));
        peers_besides(config.peers, "");  // a node or URL named twice is refused before serve starts
        for (const ListenSpec& spec : config.listen) {
            if (!spec.tcp || config.token)
                continue;
            if (!no_auth)
                throw Error(fmt::format("--listen {} needs a token: give --token-file FILE (or --no-auth, for a "
                                        "loopback address only)", spec.text()));
            if (!spec.loopback())
                throw Error(fmt::format("--listen {}: --no-auth is allowed on loopback addresses only",
                                        spec.text()));
        }
        return run_serve(config);
    } catch (const std::exception& e) {
        spdlog::error("{}", e.what());
        return exit_code::error;
    }
}
