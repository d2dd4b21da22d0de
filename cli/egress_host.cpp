#include <CLI/CLI.hpp>

#include "cli/egress_host.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "common/fd.hpp"
#include "common/share_with_vm.hpp"
#include "core/event_loop.hpp"

namespace agentvm {

namespace {

constexpr int ready_patience_ms = 10000;

void log_outcome(const EgressOutcome& outcome)
{
    const std::string what = outcome.method.empty() ? std::string("connection")
                                                    : fmt::format("{} {}", outcome.method, outcome.destination);
    if (outcome.allowed)
        spdlog::debug("egress: {} via {}: {} B out, {} B in, {:.2f} s ({})", what, outcome.address,
                     outcome.bytes_out, outcome.bytes_in, outcome.seconds, outcome.reason);
    else
        spdlog::debug("egress: {} refused ({}): {}", what,
                     outcome.refusal ? static_cast<int>(*outcome.refusal) : 0, outcome.reason);
}

// The proxy process: listens, tells the parent on `ready`, serves until its parent is gone.
[[noreturn]] void proxy_main(EgressPolicy policy, EgressLimits limits, const std::string& socket, Fd ready,
                             pid_t parent)
{
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent)
        ::_exit(0);
    try {
        EventLoop loop;
        SocketPoller poller(loop);
        NameResolver resolver(loop);
        EgressProxy::Hooks hooks;
        hooks.on_request = [](const ProxyRequest&) { return uint64_t{0}; };
        hooks.on_end = [](std::optional<uint64_t>, const EgressOutcome& outcome) { log_outcome(outcome); };
        EgressProxy proxy(loop, poller, resolver, std::move(policy), limits, socket, std::move(hooks));
        const char byte = 1;
        if (::write(ready.get(), &byte, 1) != 1)
            ::_exit(1);
        ready.reset();
        loop.run();
    } catch (const std::exception& e) {
        spdlog::error("egress: {}", e.what());
        ::_exit(1);
    }
    ::_exit(0);
}

} // namespace

std::unique_ptr<EgressHost> EgressHost::start(const EgressFlags& flags, std::string& vsock_uds,
                                              const std::optional<JailIdentity>& vm_identity)
{
    EgressPolicy policy;
    try {
        policy = EgressPolicy::parse(flags.allow, flags.deny);
    } catch (const Error& e) {
        throw Error(fmt::format("--egress-allow/--egress-deny: {}", e.what()));
    }
    if (!policy.allows_any())
        return nullptr;
    std::unique_ptr<EgressHost> host(new EgressHost);
    if (vsock_uds.empty()) {
        const char* tmpdir = std::getenv("TMPDIR");
        std::string pattern = fmt::format("{}/agentvm-egress.XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
        if (::mkdtemp(pattern.data()) == nullptr)
            throw_errno(fmt::format("making a directory for the VM's vsock socket ({})", pattern));
        host->temporary_dir_ = pattern;
        vsock_uds = pattern + "/vsock";
    }
    host->socket_ = EgressProxy::socket_for(vsock_uds);
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0)
        throw_errno("pipe for the egress proxy");
    Fd ready_read(fds[0]);
    Fd ready_write(fds[1]);
    const pid_t parent = ::getpid();
    host->pid_ = ::fork();
    if (host->pid_ < 0)
        throw_errno("fork for the egress proxy");
    if (host->pid_ == 0) {
        ready_read.reset();
        proxy_main(std::move(policy), flags.limits, host->socket_, std::move(ready_write), parent);
    }
    ready_write.reset();
    pollfd polled{ready_read.get(), POLLIN, 0};
    char byte = 0;
    if (::poll(&polled, 1, ready_patience_ms) != 1 || ::read(ready_read.get(), &byte, 1) != 1)
        throw Error(fmt::format("the egress proxy did not start listening at {} (its log is above)", host->socket_));
    // A VMM of its own gid reaches the socket through the private directory's group.
    if (vm_identity) {
        if (!host->temporary_dir_.empty())
            share_with_vm(host->temporary_dir_, vm_identity->gid, 0770);
        share_with_vm(host->socket_, vm_identity->gid, 0660);
    }
    spdlog::debug("egress: {} (proxy at {})", policy.describe(), host->socket_);
    return host;
}

void add_egress_flags(CLI::App& command, EgressFlags& flags)
{
    command.add_option("--egress-allow", flags.allow,
                       "RULE: where the guest may connect out, through the proxy on its 127.0.0.1:3128 (HTTP_PROXY "
                       "and HTTPS_PROXY are set for its commands): HOST[:PORTS], HOST a name, *.domain, an IP or "
                       "CIDR range, or * (public addresses only); repeatable (default: nowhere; docs/api.md, "
                       "\"Egress\")")
        ->allow_extra_args(false);
    command.add_option("--egress-deny", flags.deny, "RULE: where it may not, even when an allow rule matches")
        ->allow_extra_args(false);
    command.add_option("--egress-max-connections", flags.limits.max_connections,
                       "connections out open at once; past it the proxy answers 429")
        ->capture_default_str()
        ->check(CLI::Range(size_t{1}, size_t{65536}));
    command.add_option("--egress-max-bytes", flags.limits.max_bytes,
                       "bytes through the proxy over the VM's life, both ways; past it connections are cut")
        ->capture_default_str()
        ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 50));
}

EgressHost::~EgressHost()
{
    if (::getpid() != owner_)
        return;
    if (pid_ > 0) {
        ::kill(pid_, SIGTERM);
        int status = 0;
        while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
        }
    }
    std::error_code ignored;
    std::filesystem::remove(socket_, ignored);
    if (!temporary_dir_.empty())
        std::filesystem::remove_all(temporary_dir_, ignored);
}

} // namespace agentvm
