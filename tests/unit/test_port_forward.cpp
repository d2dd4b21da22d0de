// `agentvm port-forward` end to end, against far ends written here: a fake VM socket that
// speaks the hybrid vsock handshake and the guest's port-forward service (CONNECT 53 / OK,
// PORT P / OK or ERR), and a fake serve that answers the TCP upgrade (101, or a JSON error).
// Behind either, the "guest" does what its port says:
//   7   echoes, and after the client's end-of-file sends "bye\n" and ends its side;
//   8   sends "early-close\n" and ends its side first, then keeps what the client still sends;
//   9   (hybrid) refused: ERR connection refused;
//   22  as 7, but its banner comes in the same write as the handshake's last answer.
// The forwarder runs in-process on a thread of its own; the last cases run the agentvm binary.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include "cli/port_forward/address.hpp"
#include "cli/port_forward/forwarder.hpp"
#include "cli/port_forward/hybrid_handshake.hpp"
#include "cli/port_forward/serve_handshake.hpp"
#include "cli/port_forward/sockets.hpp"
#include "cli/port_forward/upgrade_head.hpp"
#include "common/error.hpp"
#include "common/fd.hpp"
#include "common/file_digest.hpp"
#include "tests/support/process.hpp"

using namespace agentvm;
using namespace std::chrono_literals;

namespace {

// ---- the log, captured so the cases can check the reasons the forwarder gives ----

class CaptureSink : public spdlog::sinks::base_sink<std::mutex> {
public:
    bool contains(const std::string& text)
    {
        std::lock_guard lock(mutex_);
        for (const std::string& line : lines_)
            if (line.find(text) != std::string::npos)
                return true;
        return false;
    }
    std::string all()
    {
        std::lock_guard lock(mutex_);
        std::string text;
        for (const std::string& line : lines_)
            text += line + "\n";
        return text;
    }

protected:
    void sink_it_(const spdlog::details::log_msg& msg) override
    {
        lines_.emplace_back(msg.payload.data(), msg.payload.size());
    }
    void flush_() override {}

private:
    std::vector<std::string> lines_;
};

CaptureSink& logs()
{
    static const std::shared_ptr<CaptureSink> sink = [] {
        auto made = std::make_shared<CaptureSink>();
        auto logger = std::make_shared<spdlog::logger>("port-forward-test", made);
        logger->set_level(spdlog::level::debug);
        spdlog::set_default_logger(logger);
        return made;
    }();
    return *sink;
}

bool log_shows(const std::string& text, std::chrono::milliseconds patience = 5s)
{
    const auto until = std::chrono::steady_clock::now() + patience;
    while (!logs().contains(text)) {
        if (std::chrono::steady_clock::now() > until)
            return false;
        std::this_thread::sleep_for(10ms);
    }
    return true;
}

// ---- plain blocking socket helpers for the clients and the fakes ----

struct TempDir {
    std::string path;
    TempDir()
    {
        char pattern[] = "/tmp/agentvm-pf-XXXXXX";
        REQUIRE(::mkdtemp(pattern) != nullptr);
        path = pattern;
    }
    ~TempDir() { std::filesystem::remove_all(path); }
};

void with_timeouts(int fd)
{
    const timeval tv{20, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

// A blocking client socket connected to a listener's text: 127.0.0.1:N or unix:PATH.
Fd connect_to(const std::string& where)
{
    const SocketAddress address = resolve(parse_listen_address(where)).at(0);
    Fd fd(::socket(address.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(fd);
    REQUIRE_MESSAGE(::connect(fd.get(), address.get(), address.length) == 0, where, ": ", std::strerror(errno));
    with_timeouts(fd.get());
    return fd;
}

bool send_all(int fd, std::string_view bytes)
{
    while (!bytes.empty()) {
        const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return false;
        }
        bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
}

// Up to `n` bytes, fewer at end-of-file or an error (a timeout included).
std::string recv_exactly(int fd, size_t n)
{
    std::string out;
    char buffer[65536];
    while (out.size() < n) {
        const ssize_t got = ::recv(fd, buffer, std::min(sizeof(buffer), n - out.size()), 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        out.append(buffer, static_cast<size_t>(got));
    }
    return out;
}

// Everything until end-of-file; *clean is false when it ended in an error (a timeout, a reset).
std::string recv_until_eof(int fd, bool* clean = nullptr)
{
    std::string out;
    char buffer[65536];
    for (;;) {
        const ssize_t got = ::recv(fd, buffer, sizeof(buffer), 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            if (clean)
                *clean = got == 0;
            return out;
        }
        out.append(buffer, static_cast<size_t>(got));
    }
}

// One line, read a byte at a time so nothing after it is taken; "" at end-of-file.
std::string recv_line(int fd)
{
    std::string line;
    char c = 0;
    while (line.size() < 100000 && ::recv(fd, &c, 1, 0) == 1) {
        if (c == '\n')
            return line;
        line += c;
    }
    return {};
}

std::string random_bytes(size_t n, unsigned seed)
{
    std::mt19937_64 random(seed);
    std::string bytes(n, '\0');
    for (size_t i = 0; i < n; i += 8) {
        const uint64_t word = random();
        std::memcpy(bytes.data() + i, &word, std::min<size_t>(8, n - i));
    }
    return bytes;
}

// ---- the fake far ends ----

// What the fake guests saw, for the cases to check.
struct GuestRecord {
    std::mutex mutex;
    std::string late_bytes;          // port 8: what came after the guest had ended its side
    std::vector<std::string> heads;  // the fake serve: each request head
    bool late_done = false;
};

void echo(int fd)
{
    char buffer[65536];
    for (;;) {
        const ssize_t got = ::recv(fd, buffer, sizeof(buffer), 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0 || !send_all(fd, std::string_view(buffer, static_cast<size_t>(got))))
            return;
    }
}

// The guest's server behind the handshake, by port.
void guest_side(int fd, unsigned port, GuestRecord& record)
{
    if (port == 7 || port == 22) {
        echo(fd);
        send_all(fd, "bye\n");
        ::shutdown(fd, SHUT_WR);
    } else if (port == 8) {
        send_all(fd, "early-close\n");
        ::shutdown(fd, SHUT_WR);
        const std::string late = recv_until_eof(fd);
        std::lock_guard lock(record.mutex);
        record.late_bytes += late;
        record.late_done = true;
    }
}

// A listening socket and a thread per connection running `handler`; closing it stops
// accepting, shuts every connection down and joins the threads.
class FakeServer {
public:
    FakeServer(Fd listener, std::function<void(int)> handler)
        : listener_(std::move(listener)), handler_(std::move(handler)), stop_(::eventfd(0, EFD_CLOEXEC))
    {
        REQUIRE(stop_);
        acceptor_ = std::thread([this] { accept_loop(); });
    }
    ~FakeServer()
    {
        const uint64_t one = 1;
        (void)!::write(stop_.get(), &one, sizeof(one));
        acceptor_.join();
        {
            std::lock_guard lock(mutex_);
            for (const int fd : open_)
                ::shutdown(fd, SHUT_RDWR);
        }
        for (std::thread& worker : workers_)
            worker.join();
    }
    FakeServer(const FakeServer&) = delete;
    FakeServer& operator=(const FakeServer&) = delete;

    int peak() const { return peak_; }
    int accepted() const { return accepted_; }

private:
    void accept_loop()
    {
        for (;;) {
            pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
            if (::poll(fds, 2, -1) < 0 || fds[1].revents)
                return;
            const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
            if (fd < 0)
                continue;
            with_timeouts(fd);
            std::lock_guard lock(mutex_);
            open_.insert(fd);
            ++accepted_;
            peak_ = std::max(peak_.load(), static_cast<int>(open_.size()));
            workers_.emplace_back([this, fd] {
                handler_(fd);
                std::lock_guard done(mutex_);
                open_.erase(fd);
                ::close(fd);
            });
        }
    }

    Fd listener_;
    std::function<void(int)> handler_;
    Fd stop_;
    std::mutex mutex_;
    std::set<int> open_;
    std::vector<std::thread> workers_;
    std::atomic<int> peak_ = 0;
    std::atomic<int> accepted_ = 0;
    std::thread acceptor_;
};

Fd blocking_listener(const SocketAddress& address)
{
    Fd fd(::socket(address.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(fd);
    REQUIRE(::bind(fd.get(), address.get(), address.length) == 0);
    REQUIRE(::listen(fd.get(), 128) == 0);
    return fd;
}

// A VM's --vsock-uds socket with the guest's port-forward service behind vsock port 53.
class FakeVsock {
public:
    explicit FakeVsock(const std::string& path)
        : path_(path),
          server_(blocking_listener(resolve(parse_unix_path("--uds", path)).at(0)), [this](int fd) { serve(fd); })
    {
    }

    std::atomic<bool> refuse_connect = false;  // close on CONNECT, as the VMM does when nothing listens
    std::atomic<bool> silent = false;          // never answer CONNECT
    GuestRecord record;
    const std::string& path() const { return path_; }
    int peak() const { return server_.peak(); }

private:
    void serve(int fd)
    {
        if (recv_line(fd) != "CONNECT 53")
            return;
        if (refuse_connect)
            return;
        if (silent) {
            recv_until_eof(fd);
            return;
        }
        send_all(fd, "OK 1073741824\n");
        const std::string request = recv_line(fd);
        if (!request.starts_with("PORT "))
            return;
        const unsigned port = static_cast<unsigned>(std::stoul(request.substr(5)));
        if (port == 9) {
            send_all(fd, "ERR connection refused\n");
            return;
        }
        send_all(fd, port == 22 ? "OK\nSSH-2.0-fake\r\n" : "OK\n");
        guest_side(fd, port, record);
    }

    std::string path_;
    FakeServer server_;
};

// serve, as far as the TCP upgrade goes. Sandbox sb-echo upgrades; sb-dead answers 502 with
// serve's error and keeps the connection open; sb-gone answers 404 in the nested shape.
class FakeServe {
public:
    FakeServe() : server_(listener(), [this](int fd) { serve(fd); }) {}

    uint16_t port() const { return port_; }
    GuestRecord record;

private:
    Fd listener()
    {
        Endpoint endpoint;
        endpoint.host = "127.0.0.1";
        Fd fd = blocking_listener(resolve(endpoint).at(0));
        sockaddr_in bound{};
        socklen_t length = sizeof(bound);
        REQUIRE(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &length) == 0);
        port_ = ntohs(bound.sin_port);
        return fd;
    }

    void serve(int fd)
    {
        std::string head;
        char c = 0;
        while (!head.ends_with("\r\n\r\n") && head.size() < 65536 && ::recv(fd, &c, 1, 0) == 1)
            head += c;
        {
            std::lock_guard lock(record.mutex);
            record.heads.push_back(head);
        }
        const size_t start = head.find("/v1/sandboxes/");
        const size_t tcp = head.find("/tcp/");
        if (start == std::string::npos || tcp == std::string::npos)
            return;
        const std::string sandbox = head.substr(start + 14, tcp - start - 14);
        const unsigned port = static_cast<unsigned>(std::stoul(head.substr(tcp + 5)));
        if (sandbox == "sb-echo") {
            send_all(fd, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: agentvm-tcp\r\nConnection: Upgrade\r\n\r\n" +
                             std::string(port == 22 ? "SSH-2.0-fake\r\n" : ""));
            guest_side(fd, port, record);
        } else if (sandbox == "sb-dead") {
            const std::string body = R"({"error":"vm_died","message":"the sandbox's VM died"})";
            send_all(fd, "HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/json\r\nContent-Length: " +
                             std::to_string(body.size()) + "\r\n\r\n" + body);
            recv_until_eof(fd);
        } else {
            const std::string body = R"({"error":{"code":"not_found","message":"no sandbox ')" + sandbox + "'\"}}";
            send_all(fd, "HTTP/1.1 404 Not Found\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
                             body);
        }
    }

    // Before server_: its threads may ask for the port.
    uint16_t port_ = 0;
    FakeServer server_;
};

GuestRoute hybrid_route(const std::string& path, uint16_t port)
{
    GuestRoute route;
    route.addresses = resolve(parse_unix_path("--uds", path));
    route.handshake = [port] { return std::make_unique<HybridVsockHandshake>(port); };
    return route;
}

GuestRoute serve_route(uint16_t serve_port, const std::string& sandbox, uint16_t port, const std::string& token = "")
{
    const ServeUrl url = parse_serve_url("http://127.0.0.1:" + std::to_string(serve_port));
    GuestRoute route;
    route.addresses = resolve(url.endpoint);
    const std::string request = upgrade_request_text({url.host_header, url.prefix, sandbox, port, token});
    route.handshake = [request] { return std::make_unique<ServeUpgradeHandshake>(request); };
    return route;
}

// The forwarder on a thread of its own, listening on 127.0.0.1:0 (or `listen`).
class RunningForwarder {
public:
    explicit RunningForwarder(GuestRoute route, uint16_t guest_port = 7,
                              std::chrono::milliseconds timeout = Forwarder::default_handshake_timeout,
                              const std::string& listen = "127.0.0.1:0")
        : listener_(parse_listen_address(listen)), stop_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
          forwarder_(listener_.fd(), std::move(route), guest_port, timeout)
    {
        logs();
        REQUIRE(stop_);
        thread_ = std::thread([this] {
            try {
                forwarder_.run(stop_.get());
            } catch (const std::exception& e) {
                failure_ = e.what();
            }
        });
    }
    ~RunningForwarder()
    {
        const uint64_t one = 1;
        (void)!::write(stop_.get(), &one, sizeof(one));
        thread_.join();
        CHECK_MESSAGE(failure_.empty(), failure_);
    }

    const std::string& where() const { return listener_.text(); }
    Fd connect() const { return connect_to(where()); }

private:
    Listener listener_;
    Fd stop_;
    Forwarder forwarder_;
    std::string failure_;
    std::thread thread_;
};

// Sends `data` from a thread while reading everything until end-of-file here.
std::string round_trip(int fd, const std::string& data)
{
    std::thread writer([&] {
        send_all(fd, data);
        ::shutdown(fd, SHUT_WR);
    });
    bool clean = false;
    std::string received = recv_until_eof(fd, &clean);
    writer.join();
    CHECK(clean);
    return received;
}

} // namespace

TEST_CASE("through a VM's socket: bytes both ways unchanged, and each side's end reaches the other")
{
    TempDir dir;
    FakeVsock vm(dir.path + "/vm.sock");
    RunningForwarder forward(hybrid_route(vm.path(), 7));
    Fd client = forward.connect();
    const std::string bytes = std::string("hello\n\0\x01\xff\r\n", 11) + random_bytes(1000, 1);
    REQUIRE(send_all(client.get(), bytes));
    CHECK(recv_exactly(client.get(), bytes.size()) == bytes);
    // Our end-of-file reaches the guest (it answers "bye" only then), and the guest can still
    // write after it; then its own end reaches us.
    ::shutdown(client.get(), SHUT_WR);
    bool clean = false;
    CHECK(recv_until_eof(client.get(), &clean) == "bye\n");
    CHECK(clean);
}

TEST_CASE("the guest's first bytes, sent with the handshake's last answer, are kept")
{
    TempDir dir;
    FakeVsock vm(dir.path + "/vm.sock");
    FakeServe serve;
    SUBCASE("through a VM's socket")
    {
        RunningForwarder forward(hybrid_route(vm.path(), 22), 22);
        Fd client = forward.connect();
        CHECK(recv_line(client.get()) == "SSH-2.0-fake\r");
        CHECK(round_trip(client.get(), "x") == "xbye\n");
    }
    SUBCASE("through serve")
    {
        RunningForwarder forward(serve_route(serve.port(), "sb-echo", 22), 22);
        Fd client = forward.connect();
        CHECK(recv_line(client.get()) == "SSH-2.0-fake\r");
        CHECK(round_trip(client.get(), "x") == "xbye\n");
    }
}

TEST_CASE("the guest ending its side first: the client still sends, and the guest still gets it")
{
    TempDir dir;
    FakeVsock vm(dir.path + "/vm.sock");
    FakeServe serve;
    for (const bool through_serve : {false, true}) {
        CAPTURE(through_serve);
        GuestRecord& record = through_serve ? serve.record : vm.record;
        RunningForwarder forward(through_serve ? serve_route(serve.port(), "sb-echo", 8) : hybrid_route(vm.path(), 8),
                                 8);
        Fd client = forward.connect();
        CHECK(recv_line(client.get()) == "early-close");
        char c = 0;
        CHECK(::recv(client.get(), &c, 1, 0) == 0);  // the guest's end-of-file
        REQUIRE(send_all(client.get(), "late words\n"));
        ::shutdown(client.get(), SHUT_WR);
        bool clean = false;
        CHECK(recv_until_eof(client.get(), &clean).empty());
        CHECK(clean);
        const auto until = std::chrono::steady_clock::now() + 5s;
        auto late_done = [&record] {
            std::lock_guard lock(record.mutex);
            return record.late_done;
        };
        while (!late_done() && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(10ms);
        std::lock_guard lock(record.mutex);
        CHECK(record.late_bytes == "late words\n");
        record.late_bytes.clear();
        record.late_done = false;
    }
}

TEST_CASE("16 MiB each way, compared by hash")
{
    TempDir dir;
    FakeVsock vm(dir.path + "/vm.sock");
    FakeServe serve;
    const std::string data = random_bytes(16 << 20, 16);
    const std::string expected = sha256_hex(data + "bye\n");
    for (const bool through_serve : {false, true}) {
        CAPTURE(through_serve);
        RunningForwarder forward(through_serve ? serve_route(serve.port(), "sb-echo", 7) : hybrid_route(vm.path(), 7));
        Fd client = forward.connect();
        const std::string received = round_trip(client.get(), data);
        CHECK(received.size() == data.size() + 4);
        CHECK(sha256_hex(received) == expected);
    }
}

TEST_CASE("20 connections at once, each its own stream")
{
    TempDir dir;
    FakeVsock vm(dir.path + "/vm.sock");
    RunningForwarder forward(hybrid_route(vm.path(), 7));
    constexpr int count = 20;
    std::vector<Fd> clients;
    for (int i = 0; i < count; ++i) {
        clients.push_back(forward.connect());
        const std::string hello = "hello " + std::to_string(i) + "\n";
        REQUIRE(send_all(clients.back().get(), hello));
        REQUIRE(recv_exactly(clients.back().get(), hello.size()) == hello);
    }
    // Every one is open at the guest at the same time.
    CHECK(vm.peak() == count);
    std::vector<std::string> received(count);
    std::vector<std::thread> threads;
    for (int i = 0; i < count; ++i)
        threads.emplace_back([&, i] {
            received[static_cast<size_t>(i)] = round_trip(clients[static_cast<size_t>(i)].get(),
                                                          random_bytes(1 << 20, static_cast<unsigned>(100 + i)));
        });
    for (std::thread& thread : threads)
        thread.join();
    for (int i = 0; i < count; ++i) {
        const std::string sent = random_bytes(1 << 20, static_cast<unsigned>(100 + i));
        CHECK_MESSAGE(received[static_cast<size_t>(i)] == sent + "bye\n", "connection ", i);
    }
}

TEST_CASE("a client that does not read: the forwarder stops reading it, and nothing is lost")
{
    TempDir dir;
    FakeVsock vm(dir.path + "/vm.sock");
    RunningForwarder forward(hybrid_route(vm.path(), 7));
    Fd client = forward.connect();
    const int flags = ::fcntl(client.get(), F_GETFL);
    REQUIRE(::fcntl(client.get(), F_SETFL, flags | O_NONBLOCK) == 0);
    // The echo comes back to a client that reads nothing: the guest's writes stall, then its
    // reads, then the forwarder's reads of the client, and at last the client's writes. What
    // was taken by then is the sockets' buffers and the forwarder's two, not everything sent.
    const std::string chunk = random_bytes(64 * 1024, 7);
    std::string sent;
    while (sent.size() < (256u << 20)) {
        const ssize_t n = ::send(client.get(), chunk.data(), chunk.size(), MSG_NOSIGNAL);
        if (n > 0) {
            sent.append(chunk, 0, static_cast<size_t>(n));
            continue;
        }
        REQUIRE(errno == EAGAIN);
        pollfd fd{client.get(), POLLOUT, 0};
        if (::poll(&fd, 1, 500) == 0)
            break;
    }
    CHECK(sent.size() < (64u << 20));
    REQUIRE(::fcntl(client.get(), F_SETFL, flags) == 0);
    const std::string received = round_trip(client.get(), "");
    CHECK(received.size() == sent.size() + 4);
    CHECK(received == sent + "bye\n");
}

TEST_CASE("a refused handshake closes that connection only, and the reason is logged")
{
    TempDir dir;
    FakeVsock vm(dir.path + "/vm.sock");
    RunningForwarder forward(hybrid_route(vm.path(), 7));
    Fd good = forward.connect();
    REQUIRE(send_all(good.get(), "one\n"));
    REQUIRE(recv_exactly(good.get(), 4) == "one\n");

    vm.refuse_connect = true;
    Fd refused = forward.connect();
    char c = 0;
    CHECK(::recv(refused.get(), &c, 1, 0) == 0);
    CHECK(log_shows("to guest port 7: the VM closed the connection on CONNECT 53: nothing in the guest listens on "
                    "vsock port 53 (its port-forward service); closing it"));
    vm.refuse_connect = false;

    // The first connection goes on, and new ones work again.
    REQUIRE(send_all(good.get(), "two\n"));
    CHECK(recv_exactly(good.get(), 4) == "two\n");
    Fd again = forward.connect();
    CHECK(round_trip(again.get(), "three") == "threebye\n");
    CHECK(round_trip(good.get(), "") == "bye\n");
}

TEST_CASE("refusal reasons: the guest's ERR, serve's JSON errors, no socket, no answer in time")
{
    TempDir dir;
    FakeVsock vm(dir.path + "/vm.sock");
    FakeServe serve;
    struct Case {
        const char* name;
        std::function<GuestRoute()> route;
        std::string logged;
    };
    const std::vector<Case> cases = {
        {"the guest's ERR", [&] { return hybrid_route(vm.path(), 9); }, "the guest refused port 9: connection refused"},
        {"serve's 502", [&] { return serve_route(serve.port(), "sb-dead", 7); },
         "serve answered 502 Bad Gateway: vm_died: the sandbox's VM died"},
        {"serve's 404", [&] { return serve_route(serve.port(), "sb-nope", 7); },
         "serve answered 404 Not Found: not_found: no sandbox 'sb-nope'"},
        {"no socket", [&] { return hybrid_route(dir.path + "/none.sock", 7); },
         "connecting to unix:" + dir.path + "/none.sock: No such file or directory"},
        {"nothing listening on serve's port",
         [&] {
             GuestRoute route = serve_route(serve.port(), "sb-echo", 7);
             route.addresses = resolve(parse_listen_address("127.0.0.1:1"));
             return route;
         },
         "connecting to 127.0.0.1:1: Connection refused"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.name);
        RunningForwarder forward(c.route(), 7);
        Fd client = forward.connect();
        char byte = 0;
        CHECK(::recv(client.get(), &byte, 1, 0) == 0);
        CHECK_MESSAGE(log_shows(c.logged), logs().all());
    }

    vm.silent = true;
    RunningForwarder slow(hybrid_route(vm.path(), 7), 7, 300ms);
    Fd client = slow.connect();
    const auto start = std::chrono::steady_clock::now();
    char byte = 0;
    CHECK(::recv(client.get(), &byte, 1, 0) == 0);
    CHECK(std::chrono::steady_clock::now() - start >= 250ms);
    CHECK_MESSAGE(log_shows("did not finish the handshake within 0.3 s; closing it"), logs().all());
}

TEST_CASE("the upgrade request names the sandbox and port, and carries the Host and the token")
{
    FakeServe serve;
    {
        RunningForwarder forward(serve_route(serve.port(), "sb-echo", 7, "s3cret"));
        Fd client = forward.connect();
        CHECK(round_trip(client.get(), "ping") == "pingbye\n");
    }
    std::lock_guard lock(serve.record.mutex);
    REQUIRE(serve.record.heads.size() == 1);
    CHECK(serve.record.heads[0] == "GET /v1/sandboxes/sb-echo/tcp/7 HTTP/1.1\r\n"
                                   "Host: 127.0.0.1:" + std::to_string(serve.port()) + "\r\n"
                                   "Connection: Upgrade\r\n"
                                   "Upgrade: agentvm-tcp\r\n"
                                   "Authorization: Bearer s3cret\r\n"
                                   "\r\n");
}

TEST_CASE("--listen and --serve forms")
{
    Endpoint e = parse_listen_address("127.0.0.1:0");
    CHECK((!e.unix_socket && e.host == "127.0.0.1" && e.port == 0));
    e = parse_listen_address("[::1]:8080");
    CHECK((e.host == "::1" && e.port == 8080 && e.text() == "[::1]:8080"));
    e = parse_listen_address("unix:/tmp/x.sock");
    CHECK((e.unix_socket && e.path == "/tmp/x.sock"));
    for (const char* bad : {"8080", "localhost", ":80", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:http", "::1:80",
                            "unix:", "[::1]80"})
        CHECK_THROWS_AS_MESSAGE(parse_listen_address(bad), Error, bad);
    CHECK_THROWS_WITH(parse_listen_address("unix:/" + std::string(200, 'a')),
                      doctest::Contains("a Unix socket path has at most 107 bytes"));

    ServeUrl url = parse_serve_url("http://127.0.0.1:8080");
    CHECK((url.endpoint.host == "127.0.0.1" && url.endpoint.port == 8080 && url.host_header == "127.0.0.1:8080" &&
           url.prefix.empty()));
    url = parse_serve_url("http://gpu-07/agentvm/");
    CHECK((url.endpoint.port == 80 && url.host_header == "gpu-07" && url.prefix == "/agentvm"));
    url = parse_serve_url("http://[::1]:9000");
    CHECK((url.endpoint.host == "::1" && url.host_header == "[::1]:9000"));
    url = parse_serve_url("tcp:10.0.0.5:8080");
    CHECK((url.endpoint.host == "10.0.0.5" && url.host_header == "10.0.0.5:8080"));
    for (const char* form : {"unix:/run/agentvm/serve.sock", "unix:///run/agentvm/serve.sock"}) {
        url = parse_serve_url(form);
        CHECK((url.endpoint.unix_socket && url.endpoint.path == "/run/agentvm/serve.sock" &&
               url.host_header == "localhost"));
    }
    CHECK_THROWS_WITH(parse_serve_url("https://a:1"), doctest::Contains("https is not supported"));
    for (const char* bad : {"ftp://a", "a:1", "http://", "http://:80", "http://user:pw@a:1", "http://a:0",
                            "http://a:1/x?y", "tcp:a", "unix:"})
        CHECK_THROWS_AS_MESSAGE(parse_serve_url(bad), Error, bad);
}

TEST_CASE("the guest's port-forward service handshake, byte for byte")
{
    using Kind = HandshakeStep::Kind;
    HybridVsockHandshake handshake(8080);
    CHECK(handshake.opening() == "CONNECT 53\n");
    std::string received = "OK 10";
    CHECK(handshake.advance(received, false).kind == Kind::need_more);
    received += "24\nOK";
    HandshakeStep step = handshake.advance(received, false);
    CHECK(step.kind == Kind::send);
    CHECK(step.text == "PORT 8080\n");
    CHECK(received == "OK");
    CHECK(handshake.advance(received, false).kind == Kind::need_more);
    received += "\nguest bytes";
    CHECK(handshake.advance(received, false).kind == Kind::done);
    CHECK(received == "guest bytes");

    auto refusal = [](std::string first, std::string second = "", bool eof = false) {
        HybridVsockHandshake h(22);
        HandshakeStep s = h.advance(first, eof && second.empty());
        if (s.kind == Kind::send)
            s = h.advance(second, eof);
        return s;
    };
    CHECK(refusal("OK 1\n", "ERR nothing listens on port 22\n").text ==
          "the guest refused port 22: nothing listens on port 22");
    CHECK(refusal("OK 1\n", "ERR\n").text == "the guest refused port 22: (no reason given)");
    CHECK(refusal("", "", true).text.starts_with("the VM closed the connection on CONNECT 53"));
    CHECK(refusal("OK 1\n", "", true).text == "the guest's port-forward service closed the connection on PORT 22");
    CHECK(refusal("NO\n").text == "the VM refused CONNECT 53: 'NO'");
    CHECK(refusal("OK x\n").text == "the VM refused CONNECT 53: 'OK x'");
    CHECK(refusal("OK 1\n", "YES\n").text == "the guest answered PORT 22 with 'YES'");
    CHECK(refusal(std::string(64, 'a')).text.starts_with("a line longer than 64 bytes in answer to CONNECT"));
    CHECK(refusal("OK 1\n", std::string(63, 'b') + "\n").text.starts_with("the guest answered PORT 22"));
    CHECK(refusal("OK 1\n", std::string(64, 'b') + "\n").text.starts_with("a line longer than 64 bytes in answer "
                                                                           "to PORT"));
    CHECK(refusal("OK 1\n", "ERR \x1b[2J\n").text == "the guest refused port 22: \\x1b[2J");
}

// ---- the command itself: its one line on stdout, its signals, its socket, its flags ----

namespace {

// The agentvm binary running `port-forward`, its stdout a pipe read line by line.
class Command {
public:
    // token: AGENTVM_TOKEN's value in the command's environment ("": unset there).
    Command(const std::vector<std::string>& args, const std::string& token = "")
    {
        std::vector<std::string> argv = {AGENTVM_BIN, "port-forward"};
        argv.insert(argv.end(), args.begin(), args.end());
        std::vector<std::string> env;
        for (char** entry = environ; *entry; ++entry)
            if (!std::string_view(*entry).starts_with("AGENTVM_TOKEN="))
                env.emplace_back(*entry);
        if (!token.empty())
            env.push_back("AGENTVM_TOKEN=" + token);
        std::vector<char*> raw_argv;
        for (const std::string& arg : argv)
            raw_argv.push_back(const_cast<char*>(arg.c_str()));
        raw_argv.push_back(nullptr);
        std::vector<char*> raw_env;
        for (const std::string& entry : env)
            raw_env.push_back(const_cast<char*>(entry.c_str()));
        raw_env.push_back(nullptr);
        int out[2];
        REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
        err_ = Fd(::memfd_create("stderr", MFD_CLOEXEC));
        REQUIRE(err_);
        pid_ = ::fork();
        REQUIRE(pid_ >= 0);
        if (pid_ == 0) {
            // Only async-signal-safe calls between fork and exec: the test has threads.
            ::dup2(out[1], STDOUT_FILENO);
            ::dup2(err_.get(), STDERR_FILENO);
            ::execve(raw_argv[0], raw_argv.data(), raw_env.data());
            ::_exit(127);
        }
        ::close(out[1]);
        out_ = Fd(out[0]);
    }
    ~Command()
    {
        if (pid_ > 0) {
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, nullptr, 0);
        }
    }

    // The next line of stdout, within 20 s.
    std::string line()
    {
        std::string text;
        char c = 0;
        while (text.size() < 1000) {
            pollfd fd{out_.get(), POLLIN, 0};
            if (::poll(&fd, 1, 20000) != 1 || ::read(out_.get(), &c, 1) != 1 || c == '\n')
                break;
            text += c;
        }
        return text;
    }

    // What it has written to stderr so far.
    std::string err() const
    {
        std::string text;
        char buffer[4096];
        ssize_t n = 0;
        for (off_t at = 0; (n = ::pread(err_.get(), buffer, sizeof(buffer), at)) > 0; at += n)
            text.append(buffer, static_cast<size_t>(n));
        return text;
    }

    // Sends `signal` and waits (at most 20 s) for the exit status: 128+N if killed by N.
    int stop(int signal)
    {
        ::kill(pid_, signal);
        int status = 0;
        pid_t done = 0;
        for (int i = 0; i < 2000 && (done = ::waitpid(pid_, &status, WNOHANG)) == 0; ++i)
            std::this_thread::sleep_for(10ms);
        if (done != pid_) {
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, &status, 0);
        }
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }

private:
    pid_t pid_ = -1;
    Fd out_;
    Fd err_;
};

} // namespace

TEST_CASE("agentvm port-forward --uds: prints where it listens, forwards, and exits 0 on SIGTERM")
{
    TempDir dir;
    FakeVsock vm(dir.path + "/vm.sock");
    Command command({"7", "--uds", vm.path()});
    INFO("agentvm's stderr: ", command.err());
    const std::string line = command.line();
    REQUIRE(line.starts_with("listening on 127.0.0.1:"));
    const std::string where = line.substr(13);
    CHECK(where != "127.0.0.1:0");
    Fd a = connect_to(where);
    Fd b = connect_to(where);
    CHECK(round_trip(a.get(), "first") == "firstbye\n");
    CHECK(round_trip(b.get(), "second") == "secondbye\n");
    // A connection still open when the signal comes is closed with the rest.
    Fd open = connect_to(where);
    REQUIRE(send_all(open.get(), "x"));
    REQUIRE(recv_exactly(open.get(), 1) == "x");
    CHECK(command.stop(SIGTERM) == 0);
    bool clean = false;
    CHECK(recv_until_eof(open.get(), &clean) == "");
    const std::string err = command.err();
    CHECK(err.find("agentvm: info: forwarding " + where + " to guest port 7 of the VM's socket " + vm.path()) !=
          std::string::npos);
    CHECK(err.find("agentvm: info: stopping: closing 1 connection") != std::string::npos);
    CHECK(err.find("agentvm: info: SIGTERM: stopped forwarding") != std::string::npos);
}

TEST_CASE("agentvm port-forward --serve on a Unix socket: the token from AGENTVM_TOKEN or --token-file; SIGINT "
          "removes the socket")
{
    TempDir dir;
    FakeServe serve;
    const std::string url = "http://127.0.0.1:" + std::to_string(serve.port());
    const std::string socket = dir.path + "/forward.sock";
    {
        Command command({"7", "--serve", url, "--sandbox", "sb-echo", "--listen", "unix:" + socket}, "from-env");
        INFO("agentvm's stderr: ", command.err());
        REQUIRE(command.line() == "listening on unix:" + socket);
        struct stat st {};
        REQUIRE(::stat(socket.c_str(), &st) == 0);
        CHECK((st.st_mode & 0777) == 0600);
        Fd client = connect_to("unix:" + socket);
        CHECK(round_trip(client.get(), "over serve") == "over servebye\n");
        CHECK(command.stop(SIGINT) == 0);
        CHECK(::access(socket.c_str(), F_OK) != 0);
        CHECK(command.err().find("agentvm: info: SIGINT: stopped forwarding") != std::string::npos);
    }
    const std::string token_file = dir.path + "/token";
    {
        FILE* file = std::fopen(token_file.c_str(), "w");
        REQUIRE(file);
        std::fputs("from-file\n", file);
        std::fclose(file);
        Command command({"7", "--serve", url, "--sandbox", "sb-echo", "--token-file", token_file}, "from-env");
        INFO("agentvm's stderr: ", command.err());
        const std::string line = command.line();
        REQUIRE(line.starts_with("listening on 127.0.0.1:"));
        Fd client = connect_to(line.substr(13));
        CHECK(round_trip(client.get(), "again") == "againbye\n");
        CHECK(command.stop(SIGTERM) == 0);
    }
    std::lock_guard lock(serve.record.mutex);
    REQUIRE(serve.record.heads.size() == 2);
    CHECK(serve.record.heads[0].find("\r\nAuthorization: Bearer from-env\r\n") != std::string::npos);
    CHECK(serve.record.heads[1].find("\r\nAuthorization: Bearer from-file\r\n") != std::string::npos);
}

TEST_CASE("agentvm port-forward: bad flags are refused, naming the problem")
{
    struct Case {
        std::vector<std::string> args;
        int status;
        std::string message;
    };
    TempDir dir;
    const std::vector<Case> cases = {
        {{"7"}, 2, "give --uds PATH (a VM's --vsock-uds socket) or --serve URL --sandbox ID"},
        {{"0", "--uds", "/x"}, 2, "GUEST_PORT"},
        {{"65536", "--uds", "/x"}, 2, "GUEST_PORT"},
        {{"--uds", "/x"}, 2, "GUEST_PORT is required"},
        {{"7", "--uds", "/x", "--serve", "http://a:1"}, 2, "--uds excludes --serve"},
        {{"7", "--serve", "http://a:1"}, 2, "--serve needs --sandbox ID"},
        {{"7", "--uds", "/x", "--sandbox", "sb"}, 2, "--sandbox requires --serve"},
        {{"7", "--serve", "http://127.0.0.1:1", "--sandbox", "a/b"}, 1, "--sandbox: 'a/b' is not a sandbox id"},
        {{"7", "--serve", "https://h:1", "--sandbox", "sb"}, 1, "https is not supported"},
        {{"7", "--serve", "http://127.0.0.1:1", "--sandbox", "sb", "--token-file", dir.path + "/none"}, 1,
         "cannot be read"},
        {{"7", "--uds", "/x", "--listen", "8080"}, 1, "--listen 8080: expected HOST:PORT"},
        {{"7", "--uds", "/x", "--listen", dir.path}, 1, "--listen " + dir.path + ": expected HOST:PORT"},
        {{"7", "--uds", "/x", "--listen", "unix:" + dir.path}, 1, "the path exists and is not a socket"},
        {{"7", "--uds", "/x", "--listen", "192.0.2.1:1"}, 1, "cannot listen on 192.0.2.1:1"},
    };
    for (const Case& c : cases) {
        std::vector<std::string> argv = {AGENTVM_BIN, "port-forward"};
        argv.insert(argv.end(), c.args.begin(), c.args.end());
        const test::ProcessResult result = test::run_process(argv, std::chrono::seconds(30));
        CAPTURE(result.err);
        CHECK(result.exit_code == c.status);
        CHECK(result.err.find(c.message) != std::string::npos);
        CHECK(result.out.empty());
    }
}

TEST_CASE("agentvm port-forward --listen unix: takes over a stale socket file, never a live one")
{
    TempDir dir;
    FakeVsock vm(dir.path + "/vm.sock");
    const std::string path = dir.path + "/forward.sock";
    const SocketAddress address = resolve(parse_listen_address("unix:" + path)).at(0);
    {
        Fd live = blocking_listener(address);
        const test::ProcessResult result =
            test::run_process({AGENTVM_BIN, "port-forward", "7", "--uds", vm.path(), "--listen", "unix:" + path},
                              std::chrono::seconds(30));
        CHECK(result.exit_code == 1);
        CHECK(result.err.find("--listen unix:" + path + ": another process listens on it") != std::string::npos);
    }
    // The listener above is gone; its file stays, as after a crash.
    REQUIRE(::access(path.c_str(), F_OK) == 0);
    Command command({"7", "--uds", vm.path(), "--listen", "unix:" + path});
    INFO("agentvm's stderr: ", command.err());
    REQUIRE(command.line() == "listening on unix:" + path);
    Fd client = connect_to("unix:" + path);
    CHECK(round_trip(client.get(), "fresh") == "freshbye\n");
    CHECK(command.stop(SIGTERM) == 0);
    CHECK(command.err().find("removing the stale socket " + path) != std::string::npos);
    CHECK(::access(path.c_str(), F_OK) != 0);
}
