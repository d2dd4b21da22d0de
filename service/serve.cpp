#include "service/serve.hpp"

#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <sys/stat.h>

#include <charconv>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/fd.hpp"
#include "core/event_loop.hpp"
#include "service/api.hpp"
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
    const auto [end, err] = std::from_chars(count.data(), count.data() + count.size(), pool.target);
    if (err != std::errc() || end != count.data() + count.size() || pool.target > 10000)
        throw Error(fmt::format("--pool {}: N must be a whole number from 0 to 10000", text));
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
        listeners.push_back(spec.tcp ? listen_tcp(spec.host, spec.port) : listen_unix(spec.path));
        if (!spec.tcp)
            socket_files.paths.push_back(spec.path);
    }

    EventLoop loop;
    SandboxManager manager(loop, config.sandboxes);
    ServiceApi api(manager);
    HttpServer::Options options;
    options.token = config.token;
    options.streams_body = &ServiceApi::streams_body;
    options.larger_body = &ServiceApi::larger_body;
    HttpServer server(loop, std::move(listeners), options,
                      [&api](const std::shared_ptr<HttpExchange>& exchange) { api.handle(exchange); });
    int stop_signal = 0;
    loop.watch_readable(signals.get(), [&] {
        signalfd_siginfo info{};
        if (::read(signals.get(), &info, sizeof info) != sizeof info)
            return;
        if (stop_signal != 0) {
            spdlog::warn("{} again: stopping every VM now", strsignal(static_cast<int>(info.ssi_signo)));
            loop.stop();
            return;
        }
        stop_signal = static_cast<int>(info.ssi_signo);
        spdlog::info("{}: draining (running calls have {} s to finish)", strsignal(stop_signal),
                     config.drain_grace.count());
        server.stop_accepting();
        manager.drain(config.drain_grace, [&loop] { loop.stop(); });
    });
    for (const ListenSpec& spec : config.listen)
        spdlog::info("serving on {}{}", spec.text(), config.token ? " (token required)" : "");
    loop.run();
    loop.unwatch(signals.get());
    spdlog::info("stopped by {}", strsignal(stop_signal));
    return 0;
}

} // namespace agentvm
