// A sandbox's egress proxy (service/egress/egress_proxy.hpp) without a VM: the test speaks to
// its Unix socket as the VMM would relay the guest's tools, and a TCP server of the test's on
// 127.0.0.1 stands for the outside. The loop runs on this thread, the tools on a client thread
// (tests/support/loop_with_client.hpp).
//   echo server: CONNECT tunnels to it; what the tool sends comes back.
//   http server: answers a plain request with the request line and Host it was sent.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/fd.hpp"
#include "core/event_loop.hpp"
#include "service/egress/egress_proxy.hpp"
#include "tests/support/loop_with_client.hpp"

using namespace agentvm;
using namespace std::chrono_literals;

namespace {

// A TCP server on 127.0.0.1:<ephemeral>; each connection served on a thread of its own.
class TestServer {
public:
    enum class Kind { echo, http };
    explicit TestServer(Kind kind) : kind_(kind)
    {
        listener_ = Fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        REQUIRE(::bind(listener_.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
        REQUIRE(::listen(listener_.get(), 64) == 0);
        socklen_t size = sizeof(address);
        ::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&address), &size);
        port_ = ntohs(address.sin_port);
        thread_ = std::thread([this] { accept_loop(); });
    }
    ~TestServer()
    {
        stopping_ = true;
        ::shutdown(listener_.get(), SHUT_RDWR);
        thread_.join();
        for (auto& t : served_)
            t.join();
    }
    uint16_t port() const { return port_; }
    std::string received()
    {
        std::lock_guard lock(mutex_);
        return received_;
    }

private:
    void accept_loop()
    {
        for (;;) {
            const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
            if (fd < 0)
                return;
            served_.emplace_back([this, fd] { serve(Fd(fd)); });
        }
    }
    void serve(Fd socket)
    {
        char buffer[65536];
        std::string head;
        for (;;) {
            const ssize_t n = ::recv(socket.get(), buffer, sizeof buffer, 0);
            if (n <= 0)
                return;
            if (kind_ == Kind::echo) {
                if (::send(socket.get(), buffer, static_cast<size_t>(n), MSG_NOSIGNAL) != n)
                    return;
                continue;
            }
            head.append(buffer, static_cast<size_t>(n));
            if (head.find("\r\n\r\n") == std::string::npos)
                continue;
            {
                std::lock_guard lock(mutex_);
                received_ = head;
            }
            const std::string body = head.substr(0, head.find("\r\n"));
            const std::string answer =
                "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
            ::send(socket.get(), answer.data(), answer.size(), MSG_NOSIGNAL);
            return;
        }
    }

    Kind kind_;
    Fd listener_;
    uint16_t port_ = 0;
    std::atomic<bool> stopping_ = false;
    std::thread thread_;
    std::vector<std::thread> served_;
    std::mutex mutex_;
    std::string received_;
};

Fd connect_unix(const std::string& path)
{
    Fd socket(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
    REQUIRE(::connect(socket.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
    const timeval patience{20, 0};
    ::setsockopt(socket.get(), SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof(patience));
    return socket;
}

void send_all(int fd, const std::string& bytes)
{
    REQUIRE(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()));
}

// Reads until `want` bytes or the end.
std::string read_some(int fd, size_t want)
{
    std::string out;
    char buffer[65536];
    while (out.size() < want) {
        const ssize_t n = ::recv(fd, buffer, std::min(sizeof buffer, want - out.size()), 0);
        if (n <= 0)
            break;
        out.append(buffer, static_cast<size_t>(n));
    }
    return out;
}

std::string read_to_end(int fd)
{
    return read_some(fd, size_t{1} << 30);
}

// A proxy on a socket in a fresh directory, its outcomes collected.
struct ProxyRig {
    EventLoop loop;
    SocketPoller poller{loop};
    NameResolver resolver{loop};
    std::string dir;
    std::string path;
    std::mutex mutex;
    std::vector<EgressOutcome> outcomes;
    std::vector<std::string> requests;
    std::unique_ptr<EgressProxy> proxy;

    ProxyRig(const std::vector<std::string>& allow, const std::vector<std::string>& deny, EgressLimits limits = {})
    {
        char pattern[] = "/tmp/egress-test.XXXXXX";
        REQUIRE(::mkdtemp(pattern) != nullptr);
        dir = pattern;
        path = EgressProxy::socket_for(dir + "/vsock");
        EgressProxy::Hooks hooks;
        hooks.on_request = [this](const ProxyRequest& request) {
            std::lock_guard lock(mutex);
            requests.push_back(request.method + " " + request.destination.where());
            return uint64_t{requests.size()};
        };
        hooks.on_end = [this](std::optional<uint64_t>, const EgressOutcome& outcome) {
            std::lock_guard lock(mutex);
            outcomes.push_back(outcome);
        };
        proxy = std::make_unique<EgressProxy>(loop, poller, resolver, EgressPolicy::parse(allow, deny), limits, path,
                                              std::move(hooks));
    }
    ~ProxyRig()
    {
        proxy.reset();
        std::filesystem::remove_all(dir);
    }
    void run(const std::function<void()>& tools) { test::run_loop_with_client(loop, tools); }
    // The outcomes once `count` have come, waiting on the loop for stragglers.
    std::vector<EgressOutcome> settled(size_t count)
    {
        std::vector<EgressOutcome> seen;
        test::run_loop_with_client(loop, [&] {
            for (int i = 0; i < 400; ++i) {
                {
                    std::lock_guard lock(mutex);
                    if (outcomes.size() >= count)
                        break;
                }
                std::this_thread::sleep_for(10ms);
            }
        });
        std::lock_guard lock(mutex);
        return outcomes;
    }
};

std::string status_line(const std::string& answer)
{
    return answer.substr(0, answer.find("\r\n"));
}

std::string body_of(const std::string& answer)
{
    const size_t end = answer.find("\r\n\r\n");
    return end == std::string::npos ? "" : answer.substr(end + 4);
}

} // namespace

TEST_CASE("CONNECT to an allowed address tunnels both ways, and the outcome counts the bytes")
{
    TestServer server(TestServer::Kind::echo);
    ProxyRig rig({"127.0.0.1"}, {});
    const std::string target = "127.0.0.1:" + std::to_string(server.port());
    std::string answer, echoed;
    rig.run([&] {
        const Fd tool = connect_unix(rig.path);
        send_all(tool.get(), "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n\r\nhello");
        answer = read_some(tool.get(), 39 + 5);
        send_all(tool.get(), std::string(100000, 'x'));
        echoed = read_some(tool.get(), 100000);
    });
    CHECK(answer == "HTTP/1.1 200 Connection established\r\n\r\nhello");
    CHECK(echoed == std::string(100000, 'x'));
    const auto outcomes = rig.settled(1);
    REQUIRE(outcomes.size() == 1);
    CHECK(outcomes[0].allowed);
    CHECK(outcomes[0].destination == target);
    CHECK(outcomes[0].address == target);
    CHECK(outcomes[0].bytes_out == 100005);
    CHECK(outcomes[0].bytes_in == 39 + 100005);
    CHECK(rig.requests == std::vector<std::string>{"CONNECT " + target});
}

TEST_CASE("a plain HTTP request goes upstream in origin form, Host from its URI, one request per connection")
{
    TestServer server(TestServer::Kind::http);
    ProxyRig rig({"127.0.0.1"}, {});
    const std::string target = "127.0.0.1:" + std::to_string(server.port());
    std::string answer;
    rig.run([&] {
        const Fd tool = connect_unix(rig.path);
        send_all(tool.get(), "GET http://" + target + "/simple/pip/?q=1 HTTP/1.1\r\nHost: evil.example\r\n"
                             "Proxy-Connection: keep-alive\r\nUser-Agent: t\r\n\r\n");
        answer = read_to_end(tool.get());
    });
    CHECK(status_line(answer) == "HTTP/1.1 200 OK");
    CHECK(body_of(answer) == "GET /simple/pip/?q=1 HTTP/1.1");
    const std::string head = server.received();
    CHECK(head.find("Host: " + target + "\r\n") != std::string::npos);
    CHECK(head.find("evil.example") == std::string::npos);
    CHECK(head.find("Proxy-Connection") == std::string::npos);
    CHECK(head.find("Connection: close\r\n") != std::string::npos);
}

TEST_CASE("refusals: a special address through *, a name resolving to loopback, a port not allowed, deny")
{
    TestServer server(TestServer::Kind::echo);
    const std::string port = std::to_string(server.port());
    struct Case {
        std::vector<std::string> allow, deny;
        std::string target;
        std::string status;
        std::string reason_has;
    };
    const std::vector<Case> cases = {
        {{"*"}, {}, "127.0.0.1:" + port, "HTTP/1.1 403 Forbidden", "loopback"},
        // A name allowed by its rule that resolves to a special address: refused by its address.
        {{"localhost"}, {}, "localhost:" + port, "HTTP/1.1 403 Forbidden", "loopback"},
        {{"127.0.0.1:1-100"}, {}, "127.0.0.1:" + port, "HTTP/1.1 403 Forbidden", port},
        {{"127.0.0.0/8"}, {"127.0.0.1"}, "127.0.0.1:" + port, "HTTP/1.1 403 Forbidden", "deny"},
        {{"*.invalid"}, {}, "no-such-host.invalid:443", "HTTP/1.1 502 Bad Gateway", "does not resolve"},
        {{"pypi.org"}, {}, "example.com:443", "HTTP/1.1 403 Forbidden", "example.com"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.target);
        ProxyRig rig(c.allow, c.deny);
        std::string answer;
        rig.run([&] {
            const Fd tool = connect_unix(rig.path);
            send_all(tool.get(), "CONNECT " + c.target + " HTTP/1.1\r\n\r\n");
            answer = read_to_end(tool.get());
        });
        CHECK(status_line(answer) == c.status);
        CHECK(body_of(answer).starts_with("agentvm egress: "));
        CHECK(body_of(answer).find(c.reason_has) != std::string::npos);
        const auto outcomes = rig.settled(1);
        REQUIRE(outcomes.size() == 1);
        CHECK_FALSE(outcomes[0].allowed);
        CHECK(outcomes[0].bytes_in == 0);
    }
}

TEST_CASE("a request that is not a proxy request is answered 400, and a silent one ends")
{
    ProxyRig rig({"*"}, {});
    std::string answer;
    rig.run([&] {
        const Fd tool = connect_unix(rig.path);
        send_all(tool.get(), "GET /local HTTP/1.1\r\nHost: x\r\n\r\n");
        answer = read_to_end(tool.get());
    });
    CHECK(status_line(answer) == "HTTP/1.1 400 Bad Request");
    const auto outcomes = rig.settled(1);
    REQUIRE(outcomes.size() == 1);
    CHECK(outcomes[0].refusal == ProxyRefusalStatus::bad_request);
}

TEST_CASE("the limit on connections at once: the one past it is answered 429, and a freed place is taken again")
{
    TestServer server(TestServer::Kind::echo);
    EgressLimits limits;
    limits.max_connections = 2;
    ProxyRig rig({"127.0.0.1"}, {}, limits);
    const std::string target = "127.0.0.1:" + std::to_string(server.port());
    std::string third, fourth;
    rig.run([&] {
        std::vector<Fd> open;
        for (int i = 0; i < 2; ++i) {
            open.push_back(connect_unix(rig.path));
            send_all(open.back().get(), "CONNECT " + target + " HTTP/1.1\r\n\r\n");
            REQUIRE(status_line(read_some(open.back().get(), 39)) == "HTTP/1.1 200 Connection established");
        }
        const Fd refused = connect_unix(rig.path);
        send_all(refused.get(), "CONNECT " + target + " HTTP/1.1\r\n\r\n");
        third = read_to_end(refused.get());
        open.clear();
        std::this_thread::sleep_for(300ms);  // the proxy sees both ends
        const Fd again = connect_unix(rig.path);
        send_all(again.get(), "CONNECT " + target + " HTTP/1.1\r\n\r\n");
        fourth = read_some(again.get(), 39);
    });
    CHECK(status_line(third) == "HTTP/1.1 429 Too Many Requests");
    CHECK(body_of(third).find("2 connections") != std::string::npos);
    CHECK(status_line(fourth) == "HTTP/1.1 200 Connection established");
}

TEST_CASE("the byte budget: a tunnel past it is cut, and later connections are refused")
{
    TestServer server(TestServer::Kind::echo);
    EgressLimits limits;
    limits.max_bytes = 1 << 20;
    ProxyRig rig({"127.0.0.1"}, {}, limits);
    const std::string target = "127.0.0.1:" + std::to_string(server.port());
    size_t echoed = 0;
    std::string later;
    rig.run([&] {
        const Fd tool = connect_unix(rig.path);
        send_all(tool.get(), "CONNECT " + target + " HTTP/1.1\r\n\r\n");
        REQUIRE(status_line(read_some(tool.get(), 39)) == "HTTP/1.1 200 Connection established");
        // 4 MiB out, reading the echo as it comes: the tunnel ends near 1 MiB moved.
        std::thread writer([&] {
            const std::string chunk(65536, 'y');
            for (int i = 0; i < 64; ++i)
                if (::send(tool.get(), chunk.data(), chunk.size(), MSG_NOSIGNAL) <= 0)
                    break;
        });
        echoed = read_to_end(tool.get()).size();
        ::shutdown(tool.get(), SHUT_RDWR);
        writer.join();
        const Fd next = connect_unix(rig.path);
        send_all(next.get(), "CONNECT " + target + " HTTP/1.1\r\n\r\n");
        later = read_to_end(next.get());
    });
    CHECK(echoed < (size_t{2} << 20));
    CHECK(rig.proxy->bytes_used() >= (uint64_t{1} << 20));
    CHECK(status_line(later) == "HTTP/1.1 429 Too Many Requests");
    CHECK(body_of(later).find("byte budget") != std::string::npos);
}

TEST_CASE("closing the proxy closes its tunnels and removes its socket")
{
    TestServer server(TestServer::Kind::echo);
    auto rig = std::make_unique<ProxyRig>(std::vector<std::string>{"127.0.0.1"}, std::vector<std::string>{});
    const std::string target = "127.0.0.1:" + std::to_string(server.port());
    Fd tool;
    rig->run([&] {
        tool = connect_unix(rig->path);
        send_all(tool.get(), "CONNECT " + target + " HTTP/1.1\r\n\r\n");
        REQUIRE(status_line(read_some(tool.get(), 39)) == "HTTP/1.1 200 Connection established");
    });
    const std::string path = rig->path;
    rig->proxy.reset();
    CHECK_FALSE(std::filesystem::exists(path));
    CHECK(read_to_end(tool.get()).empty());  // end of file, not a hang
    REQUIRE(rig->outcomes.size() == 1);
    CHECK(rig->outcomes[0].reason == "the sandbox ended");
}
