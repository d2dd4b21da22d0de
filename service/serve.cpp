#include "service/serve.hpp"

#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "common/fd.hpp"
#include "core/event_loop.hpp"
#include "service/api.hpp"
#include "service/http_server.hpp"

namespace agentvm {

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
    std::vector<std::string> socket_files;
    for (const ListenSpec& spec : config.listen) {
        listeners.push_back(spec.tcp ? listen_tcp(spec.host, spec.port) : listen_unix(spec.path));
        if (!spec.tcp)
            socket_files.push_back(spec.path);
    }

    EventLoop loop;
    ServiceApi api;
    HttpServer::Options options;
    options.token = config.token;
    HttpServer server(loop, std::move(listeners), options,
                      [&api](const std::shared_ptr<HttpExchange>& exchange) { api.handle(exchange); });
    int stop_signal = 0;
    loop.watch_readable(signals.get(), [&] {
        signalfd_siginfo info{};
        if (::read(signals.get(), &info, sizeof info) != sizeof info)
            return;
        stop_signal = static_cast<int>(info.ssi_signo);
        server.stop_accepting();
        loop.stop();
    });
    for (const ListenSpec& spec : config.listen)
        spdlog::info("serving on {}{}", spec.text(), config.token ? " (token required)" : "");
    loop.run();
    loop.unwatch(signals.get());
    spdlog::info("stopped by {}", strsignal(stop_signal));
    for (const std::string& path : socket_files)
        ::unlink(path.c_str());
    return 0;
}

} // namespace agentvm
