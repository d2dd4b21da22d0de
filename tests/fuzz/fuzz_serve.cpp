// Fuzzes serve's request handling where a hostile client reaches it: the input is what one
// client sends on one connection (request line, headers and body; several requests when it
// pipelines them), written over a Unix socket to the real HttpServer (libmicrohttpd
// in-process, driven by the event loop) with the real facades (ServedApis) and SandboxManager behind it,
// as `agentvm serve --no-auth` runs them. Requests about a sandbox need one: one runs at all
// times, its VM a shell script standing in for `agentvm episode` that answers every call with
// success, and "$SB" in the input stands for its id. The client shuts down its sending side
// after the input; the input ends when serve has closed the connection, or has gone quiet with
// no call running: libmicrohttpd waits out a half-closed client whose request is incomplete (a
// body shorter than its Content-Length), as it would a slow one, until the idle timeout.
//
// Findings besides crashes and sanitizer reports: an exception reaching the loop (it would end
// serve and every sandbox), an endless loop (libFuzzer's -timeout), an answer that is not HTTP,
// and a 500 "internal" (HttpExchange::fail: serve's own code threw answering).
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>

#include "common/fd.hpp"
#include "core/async_writer.hpp"
#include "core/event_loop.hpp"
#include "core/loop_timer.hpp"
#include "service/served_apis.hpp"
#include "service/http_server.hpp"
#include "service/sandbox_manager.hpp"
#include "tests/fuzz/fuzz_support.hpp"

using namespace agentvm;
using namespace agentvm::fuzz;

namespace {

constexpr std::string_view sandbox_placeholder = "$SB";
// How long serve may be silent, no call running, before the input is taken as answered. The
// fake episode answers in a few milliseconds.
constexpr auto quiet_period = std::chrono::milliseconds(30);

// Ready at once, then one answer per request line, whose id leads it as Sandbox writes it.
constexpr const char* fake_episode = R"(#!/bin/sh
echo '{"event":"ready","restored":false}'
while IFS= read -r line; do
  id=${line#'{"id":'}
  id=${id%%[,\}]*}
  echo "{\"id\":$id,\"ok\":true,\"exit_code\":0,\"stdout\":\"\",\"stderr\":\"\"}"
done
)";

class Serve {
public:
    Serve()
    {
        // Under $TMPDIR, which run_fuzzer.sh points at its scratch dir, removed after the run:
        // libFuzzer may end the process without running destructors.
        std::string name = (std::filesystem::temp_directory_path() / "agentvm-fuzz-serve-XXXXXX").string();
        check(::mkdtemp(name.data()) != nullptr, "mkdtemp");
        dir_ = name;
        const std::string program = dir_ + "/agentvm";
        std::ofstream(program) << fake_episode;
        check(::chmod(program.c_str(), 0755) == 0, "chmod the fake episode");
        socket_path_ = dir_ + "/serve.sock";

        ManagerConfig config;
        config.program = program;
        config.pools.push_back(PoolConfig{"default", {}, 0, {}});
        // The harness's sandbox fills serve: an input's creates are refused (429) rather than
        // each starting a process, unless the input ended that sandbox first.
        config.max_sandboxes = 1;
        config.mem_reserve_mib = 0;
        manager_ = std::make_unique<SandboxManager>(loop_, config);
        apis_ = std::make_unique<ServedApis>(*manager_, std::nullopt);
        HttpServer::Options options;
        options.admit = [this](HttpExchange& head) { return apis_->admit(head); };
        // Connections of inputs given up on (incomplete requests) are closed soon after.
        options.idle_timeout = std::chrono::seconds(1);
        std::vector<Fd> listeners;
        listeners.push_back(listen_unix(socket_path_));
        server_ = std::make_unique<HttpServer>(loop_, std::move(listeners), options);
    }

    // The sandbox "$SB" names: the one left by the inputs before, else a new one.
    const std::string& sandbox()
    {
        if (!sandbox_id_.empty() && manager_->find(sandbox_id_))
            return sandbox_id_;
        sandbox_id_.clear();
        // A VM an input started (a create, a /run_code) may hold serve's one place a while:
        // take its sandbox once it has one, or retry until it has gone.
        LoopTimer retry(loop_, [this] { loop_.stop(); });
        std::string refused;
        for (int attempt = 0; attempt < 500; ++attempt) {
            for (Sandbox* sandbox : manager_->sandboxes())
                if (!sandbox->stopping())
                    return sandbox_id_ = sandbox->id();
            bool answered = false;
            bool waiting = false;  // a refusal comes at once: a stop() then would end the next run()
            manager_->create("default", Sandbox::Settings{}, [&](Sandbox* sandbox, const Refusal* refusal) {
                answered = true;
                if (refusal)
                    refused = std::string(error_name(refusal->code)) + ": " + refusal->message;
                else
                    sandbox_id_ = sandbox->id();
                if (waiting)
                    loop_.stop();
            });
            if (!answered) {
                waiting = true;
                loop_.run();
            }
            if (!sandbox_id_.empty())
                return sandbox_id_;
            retry.arm(std::chrono::milliseconds(10));
            loop_.run();
        }
        std::fprintf(stderr, "the last create was refused: %s\n", refused.c_str());
        finding("no sandbox could be created for the input");
    }

    // Sends `request` on a new connection, shuts the sending side, and returns all serve
    // answered once it has closed the connection or gone quiet.
    std::string exchange(std::string request)
    {
        Fd client(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
        check(client.get() >= 0, "socket");
        sockaddr_un address{};
        address.sun_family = AF_UNIX;
        std::memcpy(address.sun_path, socket_path_.c_str(), socket_path_.size() + 1);
        check(::connect(client.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0, "connect");
        check(::fcntl(client.get(), F_SETFL, O_NONBLOCK) == 0, "O_NONBLOCK");

        std::string reply;
        bool closed = false;
        bool sent = false;  // or refused: serve may close before reading it all (401, 413)
        LoopTimer quiet(loop_, [&] {
            if (calls_running())
                return quiet.arm(quiet_period);
            loop_.unwatch(client.get());
            loop_.stop();
        });
        const auto sent_all = [&] {
            sent = true;
            if (closed)
                loop_.stop();
            else
                quiet.arm(quiet_period);
        };
        AsyncWriter writer(loop_, client.get(), [&](int) { sent_all(); });
        writer.write(std::move(request));
        writer.when_flushed([&] {
            ::shutdown(client.get(), SHUT_WR);
            sent_all();
        });
        loop_.watch_readable(client.get(), [&] {
            char buffer[16384];
            ssize_t n;
            while ((n = ::read(client.get(), buffer, sizeof buffer)) > 0)
                reply.append(buffer, static_cast<size_t>(n));
            if (n == 0 || (n < 0 && errno != EAGAIN)) {
                loop_.unwatch(client.get());
                closed = true;
                if (sent)
                    loop_.stop();
            } else if (sent) {
                quiet.arm(quiet_period);
            }
        });
        loop_.run();
        return reply;
    }

private:
    bool calls_running()
    {
        for (Sandbox* sandbox : manager_->sandboxes())
            if (sandbox->running_calls() > 0)
                return true;
        return false;
    }

    std::string dir_;
    std::string socket_path_;
    EventLoop loop_;
    std::unique_ptr<SandboxManager> manager_;
    std::unique_ptr<ServedApis> apis_;
    std::unique_ptr<HttpServer> server_;
    std::string sandbox_id_;
};

Serve& serve()
{
    static Serve instance;
    return instance;
}

// serve's answers, one after another: each is HTTP, and none is a failure of serve's own.
void check_reply(std::string_view reply)
{
    check(reply.empty() || reply.starts_with("HTTP/1."), "serve answered something that is not HTTP");
    for (size_t at = reply.find(" 500 "); at != std::string_view::npos; at = reply.find(" 500 ", at + 1)) {
        const size_t body = reply.find("\r\n\r\n", at);
        if (body != std::string_view::npos && reply.substr(body + 4).starts_with("{\"error\":\"internal\"")) {
            std::fprintf(stderr, "serve answered: %.*s\n", static_cast<int>(std::min<size_t>(reply.size() - at, 600)),
                         reply.data() + at);
            finding("serve's own code threw answering a request (500 internal)");
        }
    }
}

std::vector<uint8_t> text(std::string_view s)
{
    return {s.begin(), s.end()};
}

std::string post(std::string_view path, std::string_view body, std::string_view headers = "")
{
    return "POST " + std::string(path) + " HTTP/1.1\r\nHost: localhost\r\n" + std::string(headers) +
           "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + std::string(body);
}

std::string get(std::string_view path, std::string_view method = "GET")
{
    return std::string(method) + " " + std::string(path) + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
}

Seeds make_seeds()
{
    Seeds seeds;
    seeds.emplace_back("service", text(get("/healthz") + get("/metrics") + get("/v1/sandboxes") +
                                       get("/v1/sandboxes/$SB") + get("/nowhere")));
    seeds.emplace_back("create", text(post("/v1/sandboxes", R"j({"pool":"default","timeout":60,"idle_timeout":30,)j"
                                                            R"j("env":{"A":"b"},"metadata":{"k":["v",1]}})j")));
    seeds.emplace_back("calls",
                       text(post("/v1/sandboxes/$SB/exec", R"j({"argv":["ls","-l"],"cwd":"/tmp","env":{"X":"y"},)j"
                                                           R"j("stdin":"in","timeout":5,"max_output":1024})j") +
                            post("/v1/sandboxes/$SB/shell", R"j({"cmd":"cd /tmp && ls","stream":true})j") +
                            post("/v1/sandboxes/$SB/run_code", R"j({"code":"print(1)","timeout":2.5})j") +
                            get("/v1/sandboxes/$SB/history") + get("/v1/sandboxes/$SB/calls/1", "DELETE")));
    seeds.emplace_back("files",
                       text("PUT /v1/sandboxes/$SB/files?path=/tmp/a%20b&mode=0644 HTTP/1.1\r\nHost: localhost\r\n"
                            "Content-Length: 5\r\n\r\nhello" +
                            get("/v1/sandboxes/$SB/files?path=/tmp/a") + get("/v1/sandboxes/$SB/files/stat?path=/tmp") +
                            get("/v1/sandboxes/$SB/files/list?path=/tmp&max_entries=5")));
    seeds.emplace_back("upload-chunked", text("PUT /v1/sandboxes/$SB/files?path=/tmp/c HTTP/1.1\r\nHost: localhost\r\n"
                                              "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"));
    seeds.emplace_back("lifecycle", text(post("/v1/sandboxes/$SB/timeout", R"j({"timeout":120})j") +
                                         post("/v1/sandboxes/$SB/fork", R"j({"count":2})j") +
                                         post("/v1/sandboxes/$SB/pause", "") + post("/v1/sandboxes/$SB/resume", "") +
                                         get("/v1/sandboxes/$SB", "DELETE")));
    seeds.emplace_back("fusion", text(post("/run_code", R"j({"code":"print(1)","language":"python",)j"
                                                        R"j("run_timeout":5,"memory_limit_MB":64,"stdin":"",)j"
                                                        R"j("files":{"d/a.txt":"aGk="},"fetch_files":["d/a.txt"]})j") +
                                      post("/run_jupyter", R"j({"cells":["1+1","print(2)"],"kernel":"python3",)j"
                                                           R"j("cell_timeout":5,"total_timeout":10,"files":{}})j")));
    // E2B's control plane (service/e2b/): no key is needed here, serve runs without a token
    // and the client is local. Its sandbox traffic is refused at the door without the
    // sandbox's own token, which an input cannot know: those seeds reach admission only.
    seeds.emplace_back("e2b-control",
                       text(post("/v2/sandboxes", R"j({"templateID":"base","timeout":60,"metadata":{"k":"v"},)j"
                                                  R"j("envVars":{"A":"b"},"autoPause":false})j",
                                 "X-API-KEY: e2b_0000000000000000000000000000000000000000\r\n") +
                            get("/v2/sandboxes?metadata=k%3Dv&state=running,paused&limit=1") +
                            get("/sandboxes/$SB") + get("/sandboxes/$SB/metrics?start=0&end=1") +
                            post("/sandboxes/$SB/timeout", R"j({"timeout":30})j") +
                            post("/v2/sandboxes/$SB/connect", R"j({"timeout":30})j") +
                            post("/sandboxes/$SB/fork", R"j({"count":2,"timeout":10})j") +
                            post("/sandboxes/$SB/snapshots", R"j({"name":"s"})j") + get("/snapshots?limit=5") +
                            get("/templates/snap-0", "DELETE") + post("/sandboxes/$SB/pause", "{}") +
                            get("/sandboxes/$SB", "DELETE")));
    seeds.emplace_back("e2b-envd", text(post("/process.Process/List", "{}",
                                             "E2b-Sandbox-Id: $SB\r\nE2b-Sandbox-Port: 49983\r\n"
                                             "Content-Type: application/json\r\nX-Access-Token: x\r\n") +
                                        get("/health") +
                                        post("/execute", R"j({"code":"1"})j",
                                             "E2b-Sandbox-Id: $SB\r\nE2b-Sandbox-Port: 49999\r\n") +
                                        get("/files?path=/tmp/a&signature=v1_x&signature_expiration=1")));
    seeds.emplace_back("origin", text(post("/run_code", R"j({"code":"1","language":"bash"})j",
                                           "Origin: http://localhost:3000\r\nAuthorization: Basic eDp5\r\n")));
    return seeds;
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***)
{
    write_seeds_if_asked(make_seeds);
    quiet_logs();
    // As serve does: a client that went away is an EPIPE to handle, not a signal.
    std::signal(SIGPIPE, SIG_IGN);
    serve();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
    std::string request(reinterpret_cast<const char*>(data), size);
    if (request.find(sandbox_placeholder) != std::string::npos) {
        const std::string& id = serve().sandbox();
        for (size_t at = request.find(sandbox_placeholder); at != std::string::npos;
             at = request.find(sandbox_placeholder, at + id.size()))
            request.replace(at, sandbox_placeholder.size(), id);
    }
    check_reply(serve().exchange(std::move(request)));
    return 0;
}
