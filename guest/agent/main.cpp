// agentvm-agent: runs tool calls inside an agentvm guest for the host, which reaches it
// over virtio-vsock (docs/protocol.md). One thread per connection, plus one per running
// call; a call's failure is answered as an error and never ends the connection or the
// agent. The shell and the interpreter are the agent's, shared by its connections. Apart
// from the tool calls, the port relay (port_relay.hpp) lets the host reach the guest's TCP
// servers through a listener of its own, and the egress relay (egress_relay.hpp) carries the
// guest's proxy connections to the host's egress proxy.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "guest/agent/accounts.hpp"
#include "guest/agent/child_setup.hpp"
#include "guest/agent/connection.hpp"
#include "guest/agent/egress_relay.hpp"
#include "guest/agent/listen_address.hpp"
#include "guest/agent/port_relay.hpp"
#include "guest/agent/process_table.hpp"
#include "guest/agent/run_as.hpp"
#include "common/error.hpp"

namespace agentvm {

namespace {

constexpr char usage[] =
    "usage: agentvm-agent [--listen vsock:PORT|unix:PATH] [--ports-listen vsock:PORT|unix:PATH]\n"
    "                     [--egress-port PORT] [--egress-to vsock:PORT|unix:PATH]\n"
    "                     [--call-cgroup DIR] [--user-file PATH] [--accounts DIR] [--max-processes N]\n";

// Commands get pipes for stdio, but descriptors 0-2 must not be handed out to pipes of
// our own, or dup2 in a child would clobber them; init may start us with them closed.
void ensure_standard_fds()
{
    for (int fd = 0; fd < 3; ++fd)
        if (::fcntl(fd, F_GETFD) < 0 && ::open("/dev/null", O_RDWR) < 0)
            throw_errno("open /dev/null");
}

void serve_connection(Fd socket, Sessions& sessions)
{
    try {
        Connection connection(std::move(socket), sessions);
        connection.serve();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "agentvm-agent: connection: %s\n", e.what());
    }
}

// The sessions outlive connections, so a SIGTERM (init's shutdown, a test's agent ending)
// must take them along: a thread of its own waits for it, kills them and ends the agent by
// the same signal. Called before any other thread starts, so every thread inherits the mask.
void end_sessions_with_agent(const Sessions& sessions)
{
    sigset_t ending;
    sigemptyset(&ending);
    for (int sig : {SIGTERM, SIGINT, SIGHUP})
        sigaddset(&ending, sig);
    if (::pthread_sigmask(SIG_BLOCK, &ending, nullptr) != 0)
        throw_errno("blocking SIGTERM");
    std::thread([ending, &sessions] {
        int sig = 0;
        while (::sigwait(&ending, &sig) != 0) {
        }
        sessions.kill_on_exit();
        ::signal(sig, SIG_DFL);
        ::pthread_sigmask(SIG_UNBLOCK, &ending, nullptr);
        ::raise(sig);
    }).detach();
}

int run(int argc, char** argv)
{
    std::string spec = "vsock:" + std::to_string(agent_vsock_port);
    std::string ports_spec = "vsock:" + std::to_string(guest_ports_vsock_port);
    long egress_port = egress_proxy_tcp_port;  // 0: no egress relay (host tests that run many agents)
    std::string egress_spec = "vsock:" + std::to_string(egress_vsock_port);
    std::optional<std::string> call_cgroup;
    std::string user_file = image_user_path;  // another only for the host tests
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--listen" && i + 1 < argc) {
            spec = argv[++i];
        } else if (arg.starts_with("--listen=")) {
            spec = std::string(arg.substr(9));
        } else if (arg == "--ports-listen" && i + 1 < argc) {
            ports_spec = argv[++i];
        } else if (arg.starts_with("--ports-listen=")) {
            ports_spec = std::string(arg.substr(15));
        } else if (arg == "--egress-port" && i + 1 < argc) {
            egress_port = std::strtol(argv[++i], nullptr, 10);
            if (egress_port < 0 || egress_port > 65535) {
                std::fputs("agentvm-agent: --egress-port takes 0 (none) to 65535\n", stderr);
                return 2;
            }
        } else if (arg == "--egress-to" && i + 1 < argc) {
            egress_spec = argv[++i];
        } else if (arg == "--call-cgroup" && i + 1 < argc) {
            call_cgroup = argv[++i];
        } else if (arg == "--user-file" && i + 1 < argc) {
            user_file = argv[++i];
        } else if (arg == "--accounts" && i + 1 < argc) {
            set_accounts_dir(argv[++i]);  // passwd and group from there: only for the host tests
        } else if (arg == "--max-processes" && i + 1 < argc) {
            const long count = std::strtol(argv[++i], nullptr, 10);
            if (count < 1 || count > 65536) {
                std::fputs("agentvm-agent: --max-processes takes 1 to 65536\n", stderr);
                return 2;
            }
            ProcessTable::set_max_running(static_cast<size_t>(count));
        } else {
            std::fputs(usage, stderr);
            return 2;
        }
    }
    const ListenAddress address = parse_listen_address(spec);
    const ListenAddress ports_address = parse_listen_address(ports_spec);
    const ListenAddress egress_host = parse_listen_address(egress_spec);

    // A peer that goes away mid-answer must cost a failed send, not the agent.
    ::signal(SIGPIPE, SIG_IGN);
    ensure_standard_fds();
    confine_calls(call_cgroup);
    load_run_as(user_file.c_str());
    if (run_as())
        std::fprintf(stderr, "agentvm-agent: calls run as uid %u gid %u\n", run_as()->uid, run_as()->gid);
    Fd listener = listen_on(address);
    std::fprintf(stderr, "agentvm-agent: listening on %s\n", spec.c_str());

    // Every connection's shell and run_code calls share these; the loop below never ends, so
    // they outlive every connection thread.
    Sessions sessions;
    end_sessions_with_agent(sessions);
    start_port_relay(ports_address, ports_spec);
    if (egress_port != 0)
        start_egress_relay(static_cast<uint16_t>(egress_port), egress_host, egress_spec);
    for (;;) {
        Fd socket(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (!socket) {
            // Out of descriptors or memory, or a peer that left before we accepted: wait
            // a little and go on; the listener itself is fine.
            if (errno != EINTR)
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
            continue;
        }
        try {
            std::thread(serve_connection, std::move(socket), std::ref(sessions)).detach();
        } catch (const std::system_error& e) {
            std::fprintf(stderr, "agentvm-agent: thread: %s\n", e.what());
        }
    }
}

} // namespace

} // namespace agentvm

int main(int argc, char** argv)
{
    try {
        return agentvm::run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "agentvm-agent: %s\n", e.what());
        return 1;
    }
}
