#include <CLI/CLI.hpp>

#include "cli/port_forward_command.hpp"

#include <signal.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cli/port_forward/address.hpp"
#include "cli/port_forward/forwarder.hpp"
#include "cli/port_forward/hybrid_handshake.hpp"
#include "cli/port_forward/serve_handshake.hpp"
#include "cli/port_forward/sockets.hpp"
#include "cli/port_forward/upgrade_head.hpp"
#include "common/error.hpp"

namespace agentvm {
namespace {

struct PortForwardOptions {
    unsigned guest_port = 0;
    std::string uds;
    std::string serve;
    std::string sandbox;
    std::string token_file;
    std::string listen = "127.0.0.1:0";
};

// The token from --token-file, else $AGENTVM_TOKEN (as the Python client and fleet take it),
// else none. It goes into a header line, so it must be one word.
std::string serve_token(const std::string& token_file)
{
    std::string token;
    std::string source;
    if (!token_file.empty()) {
        std::ifstream file(token_file, std::ios::binary);
        if (!file)
            throw Error(fmt::format("--token-file {}: cannot be read", token_file));
        std::ostringstream text;
        text << file.rdbuf();
        token = text.str();
        source = "--token-file " + token_file;
    } else if (const char* value = std::getenv("AGENTVM_TOKEN"); value && *value) {
        token = value;
        source = "AGENTVM_TOKEN";
    }
    while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back())))
        token.pop_back();
    while (!token.empty() && std::isspace(static_cast<unsigned char>(token.front())))
        token.erase(0, 1);
    if (token.empty() && !token_file.empty())
        throw Error(fmt::format("{}: the file is empty", source));
    for (const char c : token)
        if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f)
            throw Error(fmt::format("{}: the token must be one word, without spaces or control characters", source));
    return token;
}

// SIGINT and SIGTERM, blocked and read through a signalfd the forwarder's poll watches, so
// they end it between two steps, never in the middle of one.
Fd stop_signals()
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    if (::sigprocmask(SIG_BLOCK, &set, nullptr) != 0)
        throw_errno("blocking SIGINT and SIGTERM");
    Fd fd(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
    if (!fd)
        throw_errno("signalfd");
    return fd;
}

int run_port_forward(const PortForwardOptions& options)
{
    const auto guest_port = static_cast<uint16_t>(options.guest_port);
    GuestRoute route;
    std::string far_end;
    if (!options.uds.empty()) {
        const Endpoint endpoint = parse_unix_path("--uds", options.uds);
        route.addresses = resolve(endpoint);
        route.handshake = [guest_port] { return std::make_unique<HybridVsockHandshake>(guest_port); };
        far_end = fmt::format("the VM's socket {}", options.uds);
        struct stat st {};
        if (::stat(options.uds.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode))
            spdlog::warn("--uds {}: no socket there (yet): connections fail until a VM started with --vsock-uds {} "
                         "runs",
                         options.uds, options.uds);
    } else {
        const ServeUrl url = parse_serve_url(options.serve);
        if (const std::string problem = sandbox_id_problem(options.sandbox); !problem.empty())
            throw Error("--sandbox: " + problem);
        try {
            route.addresses = resolve(url.endpoint);
        } catch (const Error& e) {
            throw Error(fmt::format("--serve {}: {}", options.serve, e.what()));
        }
        const std::string request = upgrade_request_text(
            {url.host_header, url.prefix, options.sandbox, guest_port, serve_token(options.token_file)});
        route.handshake = [request] { return std::make_unique<ServeUpgradeHandshake>(request); };
        far_end = fmt::format("sandbox {} of serve at {}", options.sandbox, options.serve);
    }
    const Endpoint listen = parse_listen_address(options.listen);

    // Before the line below: a script may signal as soon as it has read it.
    Fd signals = stop_signals();
    Listener listener(listen);
    std::cout << "listening on " << listener.text() << std::endl;
    spdlog::info("forwarding {} to guest port {} of {}", listener.text(), guest_port, far_end);

    Forwarder forwarder(listener.fd(), std::move(route), guest_port);
    forwarder.run(signals.get());
    signalfd_siginfo info{};
    if (::read(signals.get(), &info, sizeof(info)) == sizeof(info))
        spdlog::info("SIG{}: stopped forwarding", sigabbrev_np(static_cast<int>(info.ssi_signo)));
    return 0;
}

} // namespace

Subcommand add_port_forward_command(CLI::App& app)
{
    auto options = std::make_shared<PortForwardOptions>();
    auto* command = app.add_subcommand(
        "port-forward", "Forward a local TCP port (or Unix socket) to a TCP port in a guest: through its VM's "
                        "--vsock-uds socket, or through serve to a sandbox");
    command->add_option("GUEST_PORT", options->guest_port, "the TCP port a server in the guest listens on")
        ->required()
        ->check(CLI::Range(1, 65535));
    auto* uds = command->add_option("--uds", options->uds,
                                    "PATH: the --vsock-uds socket of an `agentvm episode` or `run` VM");
    auto* serve = command->add_option("--serve", options->serve,
                                      "URL: where agentvm serve listens: http://HOST:PORT, unix:PATH or tcp:HOST:PORT");
    auto* sandbox = command->add_option("--sandbox", options->sandbox, "ID: the sandbox, with --serve");
    auto* token_file = command->add_option("--token-file", options->token_file,
                                           "FILE: serve's token, with --serve (default: $AGENTVM_TOKEN)");
    command->add_option("--listen", options->listen, "HOST:PORT (port 0 picks a free one) or unix:PATH")
        ->capture_default_str();
    uds->excludes(serve);
    sandbox->needs(serve);
    token_file->needs(serve);
    // Checked with the flags, so that a missing one is a usage error (status 2) like the rest.
    command->callback([options] {
        if (options->uds.empty() && options->serve.empty())
            throw CLI::ValidationError("port-forward: give --uds PATH (a VM's --vsock-uds socket) or --serve URL "
                                       "--sandbox ID");
        if (!options->serve.empty() && options->sandbox.empty())
            throw CLI::ValidationError("port-forward: --serve needs --sandbox ID");
    });
    return {command, [options] { return run_port_forward(*options); }};
}

} // namespace agentvm
