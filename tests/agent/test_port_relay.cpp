// The port relay (guest/agent/port_relay.hpp, docs/protocol.md "Guest ports (vsock port 53)")
// of the real agentvm-agent binary, through --ports-listen unix:PATH as the host reaches it
// through vsock port 53: TCP servers of the test's own on 127.0.0.1 and on ::1, reached with
// "PORT <p>\n".
#include "tests/agent/agent_harness.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <sstream>

using namespace agentvm;
using namespace agentvm::agent_test;
using namespace std::chrono_literals;

namespace {

constexpr size_t mib = 1024 * 1024;

// No socket of the test's blocks a thread past this, whatever fails.
void bound_blocking(int fd, std::chrono::seconds limit = 30s)
{
    const timeval tv{static_cast<time_t>(limit.count()), 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

// For the test's helper threads, which must not REQUIRE: false when the peer failed.
bool send_all(int fd, std::string_view bytes)
{
    while (!bytes.empty()) {
        const ssize_t n = ::send(fd, bytes.data(), std::min<size_t>(bytes.size(), 1 << 20), MSG_NOSIGNAL);
        if (n <= 0)
            return false;
        bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
}

// What a helper thread read until end-of-file (or a failure, then `ended` is false).
struct Received {
    uint64_t hash = fnv1a("");
    size_t bytes = 0;
    std::string text;  // the bytes themselves, only up to keep_text
    bool ended = false;
};

Received receive_all(int fd, size_t keep_text = 1 << 20)
{
    Received got;
    std::string chunk(1 << 16, '\0');
    for (;;) {
        const ssize_t n = ::recv(fd, chunk.data(), chunk.size(), 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            got.ended = n == 0;
            return got;
        }
        const std::string_view piece(chunk.data(), static_cast<size_t>(n));
        got.hash = fnv1a(piece, got.hash);
        got.bytes += piece.size();
        if (got.text.size() < keep_text)
            got.text.append(piece.substr(0, keep_text - got.text.size()));
    }
}

std::string pseudo_random_bytes(size_t size, uint64_t seed)
{
    std::string bytes(size, '\0');
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < size; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        std::memcpy(bytes.data() + i, &x, std::min<size_t>(8, size - i));
    }
    return bytes;
}

// A TCP server of the test's, as a program in the guest would run one: on 127.0.0.1, or on ::1
// only, at a port the kernel picks. Each connection runs `serve` on a thread of its own and
// is closed when it returns. Destroy it after whatever its handler refers to.
class TcpServer {
public:
    using Handler = std::function<void(int)>;
    TcpServer(int family, Handler serve) : shared_(std::make_shared<Shared>())
    {
        shared_->serve = std::move(serve);
        listener_ = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        REQUIRE(listener_ >= 0);
        sockaddr_storage address{};
        socklen_t size = 0;
        if (family == AF_INET6) {
            const int one = 1;
            REQUIRE(::setsockopt(listener_, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)) == 0);
            sockaddr_in6 v6{};
            v6.sin6_family = AF_INET6;
            v6.sin6_addr = in6addr_loopback;
            std::memcpy(&address, &v6, sizeof(v6));
            size = sizeof(v6);
        } else {
            sockaddr_in v4{};
            v4.sin_family = AF_INET;
            v4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            std::memcpy(&address, &v4, sizeof(v4));
            size = sizeof(v4);
        }
        REQUIRE(::bind(listener_, reinterpret_cast<sockaddr*>(&address), size) == 0);
        REQUIRE(::listen(listener_, 256) == 0);
        REQUIRE(::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &size) == 0);
        port_ = family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6&>(address).sin6_port)
                                   : ntohs(reinterpret_cast<sockaddr_in&>(address).sin_port);
        acceptor_ = std::thread([this] { accept_loop(); });
    }
    ~TcpServer()
    {
        stopping_ = true;
        acceptor_.join();
        ::close(listener_);
        std::unique_lock lock(shared_->mutex);
        shared_->changed.wait_for(lock, 45s, [this] { return shared_->running == 0; });
    }
    uint16_t port() const { return port_; }
    // The most connections the server had open at once.
    int peak() const
    {
        std::lock_guard lock(shared_->mutex);
        return shared_->peak;
    }
    int accepted() const
    {
        std::lock_guard lock(shared_->mutex);
        return shared_->accepted;
    }

private:
    struct Shared {
        Handler serve;
        mutable std::mutex mutex;
        std::condition_variable changed;
        int running = 0;
        int peak = 0;
        int accepted = 0;
    };

    void accept_loop()
    {
        while (!stopping_) {
            pollfd pfd{listener_, POLLIN, 0};
            if (::poll(&pfd, 1, 20) <= 0)
                continue;
            const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
            if (fd < 0)
                continue;
            bound_blocking(fd);
            {
                std::lock_guard lock(shared_->mutex);
                ++shared_->accepted;
                shared_->peak = std::max(shared_->peak, ++shared_->running);
            }
            std::thread([shared = shared_, fd] {
                shared->serve(fd);
                ::close(fd);
                std::lock_guard lock(shared->mutex);
                --shared->running;
                shared->changed.notify_all();
            }).detach();
        }
    }

    std::shared_ptr<Shared> shared_;
    int listener_ = -1;
    uint16_t port_ = 0;
    std::atomic<bool> stopping_{false};
    std::thread acceptor_;
};

void echo(int fd)
{
    std::string chunk(1 << 16, '\0');
    for (;;) {
        const ssize_t n = ::recv(fd, chunk.data(), chunk.size(), 0);
        if (n <= 0)
            break;
        if (!send_all(fd, std::string_view(chunk.data(), static_cast<size_t>(n))))
            return;
    }
    ::shutdown(fd, SHUT_WR);
}

// A port on the loopback that nothing listens on, held (bound, not listening) for as long as
// this lives so that nothing else takes it meanwhile, on 127.0.0.1 and on ::1.
struct UnusedPort {
    int v4 = -1;
    int v6 = -1;
    uint16_t port = 0;
    UnusedPort()
    {
        v4 = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t size = sizeof(a);
        REQUIRE(::bind(v4, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
        REQUIRE(::getsockname(v4, reinterpret_cast<sockaddr*>(&a), &size) == 0);
        port = ntohs(a.sin_port);
        v6 = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in6 b{};
        b.sin6_family = AF_INET6;
        b.sin6_addr = in6addr_loopback;
        b.sin6_port = htons(port);
        const int one = 1;
        ::setsockopt(v6, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
        // If ::1 has the port in use already, the refusal there is all the same a refusal or
        // an answer: the test then fails, showing which.
        ::bind(v6, reinterpret_cast<sockaddr*>(&b), sizeof(b));
    }
    ~UnusedPort()
    {
        ::close(v4);
        ::close(v6);
    }
};

// A connection to the relay, as the host makes one through vsock port 53.
class PortClient {
public:
    explicit PortClient(const Agent& agent)
    {
        const auto deadline = Clock::now() + 10s;
        for (;;) {
            fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
            REQUIRE(fd_ >= 0);
            sockaddr_un addr{};
            addr.sun_family = AF_UNIX;
            std::strncpy(addr.sun_path, agent.ports_socket_path().c_str(), sizeof(addr.sun_path) - 1);
            if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0)
                break;
            ::close(fd_);
            REQUIRE_MESSAGE(Clock::now() < deadline, "the relay did not start listening");
            std::this_thread::sleep_for(10ms);
        }
        bound_blocking(fd_);
    }
    PortClient(PortClient&& other) noexcept
        : fd_(std::exchange(other.fd_, -1)), buffer_(std::move(other.buffer_))
    {
    }
    PortClient& operator=(PortClient&& other) noexcept
    {
        if (this != &other) {
            close();
            fd_ = std::exchange(other.fd_, -1);
            buffer_ = std::move(other.buffer_);
        }
        return *this;
    }
    ~PortClient() { close(); }
    int fd() const { return fd_; }
    void close()
    {
        if (fd_ >= 0)
            ::close(fd_);
        fd_ = -1;
    }

    void send(std::string_view bytes) { REQUIRE(send_all(fd_, bytes)); }
    void shutdown_sending() { REQUIRE(::shutdown(fd_, SHUT_WR) == 0); }

    // The next line, "\n" included, or what came before end-of-file.
    std::string line()
    {
        const auto deadline = Clock::now() + reply_timeout;
        size_t newline;
        while ((newline = buffer_.find('\n')) == std::string::npos)
            if (!fill(deadline))
                return std::exchange(buffer_, "");
        std::string line = buffer_.substr(0, newline + 1);
        buffer_.erase(0, newline + 1);
        return line;
    }
    // Exactly `size` bytes, or what came before end-of-file.
    std::string read(size_t size)
    {
        const auto deadline = Clock::now() + reply_timeout;
        while (buffer_.size() < size && fill(deadline)) {
        }
        std::string bytes = buffer_.substr(0, size);
        buffer_.erase(0, bytes.size());
        return bytes;
    }
    // Everything until end-of-file, which must come within `limit`.
    Received rest(std::chrono::seconds limit = reply_timeout)
    {
        const auto deadline = Clock::now() + limit;
        Received got;
        for (;;) {
            got.hash = fnv1a(buffer_, got.hash);
            got.bytes += buffer_.size();
            if (got.text.size() < (1 << 20))
                got.text += buffer_;
            buffer_.clear();
            if (!fill(deadline)) {
                got.ended = true;
                return got;
            }
        }
    }

private:
    // One read into buffer_; false at end-of-file. Fails the test past `deadline`.
    bool fill(Clock::time_point deadline)
    {
        for (;;) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
            REQUIRE_MESSAGE(left.count() > 0, "nothing from the relay in time");
            pollfd pfd{fd_, POLLIN, 0};
            ::poll(&pfd, 1, static_cast<int>(left.count()));
            char chunk[1 << 16];
            const ssize_t n = ::recv(fd_, chunk, sizeof(chunk), MSG_DONTWAIT);
            if (n == 0)
                return false;
            if (n > 0) {
                buffer_.append(chunk, static_cast<size_t>(n));
                return true;
            }
            REQUIRE_MESSAGE((errno == EAGAIN || errno == EINTR), "recv: " << std::strerror(errno));
        }
    }

    int fd_ = -1;
    std::string buffer_;
};

PortClient relay_to(const Agent& agent, uint16_t port)
{
    PortClient client(agent);
    client.send("PORT " + std::to_string(port) + "\n");
    REQUIRE(client.line() == "OK\n");
    return client;
}

// The answer to one request line, and that the relay closed the connection after it.
std::string refusal_of(const Agent& agent, std::string_view request)
{
    PortClient client(agent);
    client.send(request);
    const std::string answer = client.line();
    CHECK(client.rest(5s).bytes == 0);
    return answer;
}

size_t entries_in(const std::string& directory)
{
    size_t count = 0;
    for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(directory))
        ++count;
    return count;
}

// The CPU time a process has used so far, user and system, in clock ticks.
long cpu_ticks_of(pid_t pid)
{
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    // The fields after the command's name, which is in parentheses and may hold spaces.
    std::istringstream fields(text.substr(text.rfind(')') + 2));
    std::string field;
    long utime = 0;
    long stime = 0;
    for (int i = 3; i <= 15 && fields >> field; ++i) {
        if (i == 14)
            utime = std::stol(field);
        if (i == 15)
            stime = std::stol(field);
    }
    return utime + stime;
}

} // namespace

TEST_CASE("ports: a server on 127.0.0.1 is reached; bytes sent with the PORT line are kept")
{
    Agent agent;
    TcpServer server(AF_INET, echo);

    PortClient client(agent);
    // One write: the request line and what the client sends next arrive together.
    client.send("PORT " + std::to_string(server.port()) + "\nhello, ");
    CHECK(client.line() == "OK\n");
    CHECK(client.read(7) == "hello, ");
    client.send("world\n");
    CHECK(client.line() == "world\n");

    // More after the line than the relay reads with it: the rest waits in the socket.
    const std::string big = pseudo_random_bytes(100 * 1024, 7);
    PortClient second(agent);
    second.send("PORT " + std::to_string(server.port()) + "\n" + big);
    CHECK(second.line() == "OK\n");
    CHECK((second.read(big.size()) == big));
    second.shutdown_sending();
    const Received after = second.rest();
    CHECK(after.ended);
    CHECK(after.bytes == 0);
}

TEST_CASE("ports: a server on ::1 only is reached when 127.0.0.1 refuses")
{
    Agent agent;
    std::promise<std::string> request;
    TcpServer server(AF_INET6, [&request](int fd) {
        std::string got;
        char chunk[4096];
        while (got.find("\r\n\r\n") == std::string::npos) {
            const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
            if (n <= 0)
                break;
            got.append(chunk, static_cast<size_t>(n));
        }
        send_all(fd, "HTTP/1.0 200 OK\r\nContent-Length: 14\r\n\r\nhello from ::1");
        request.set_value(got);
    });
    auto requested = request.get_future();

    PortClient client(agent);
    client.send("PORT " + std::to_string(server.port()) + "\nGET / HTTP/1.0\r\nHost: sandbox\r\n\r\n");
    CHECK(client.line() == "OK\n");
    const Received answer = client.rest();
    CHECK(answer.ended);
    CHECK(answer.text == "HTTP/1.0 200 OK\r\nContent-Length: 14\r\n\r\nhello from ::1");
    REQUIRE(requested.wait_for(5s) == std::future_status::ready);
    CHECK(requested.get() == "GET / HTTP/1.0\r\nHost: sandbox\r\n\r\n");
}

TEST_CASE("ports: nothing listening is answered at once with an ERR line")
{
    Agent agent;
    const UnusedPort unused;
    const auto start = Clock::now();
    const std::string answer = refusal_of(agent, "PORT " + std::to_string(unused.port) + "\n");
    CHECK(answer == "ERR nothing listens on guest port " + std::to_string(unused.port) + " (connection refused)\n");
    CHECK(answer.size() <= 64);
    CHECK(Clock::now() - start < 3s);
}

TEST_CASE("ports: malformed request lines are refused with ERR bad request")
{
    Agent agent;
    TcpServer server(AF_INET, echo);
    const std::string number = "ERR bad request: port must be 1-65535, no sign or leading 0\n";
    const std::string shape = "ERR bad request: expected \"PORT <1-65535>\" and a newline\n";
    const std::string no_newline = "ERR bad request: no newline within 16 bytes\n";
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"PORT 0\n", number},
        {"PORT 65536\n", number},
        {"PORT 08\n", number},
        {"PORT 00080\n", number},
        {"PORT +80\n", number},
        {"PORT -1\n", number},
        {"PORT 80 \n", number},
        {"PORT 80\r\n", number},
        {"PORT 0x50\n", number},
        {"PORT \n", number},
        // 16 bytes, the last the newline: a line, refused for its number alone.
        {"PORT 0000000080\n", number},
        {"PORT\n", shape},
        {"port 80\n", shape},
        {" PORT 80\n", shape},
        {"\n", shape},
        {"hello\n", shape},
        {std::string("PORT\0 80\n", 9), shape},
        {"GET / HTTP/1.1\r\nHost: x\r\n\r\n", shape},
        // 16 bytes and no newline among them.
        {"PORT 12345678901", no_newline},
        {"PORT 99999999999\n", no_newline},
        {std::string(100, 'x'), no_newline},
    };
    for (const auto& item : cases) {
        const std::string& request = item.first;
        CAPTURE(request);
        CHECK(refusal_of(agent, request) == item.second);
        CHECK(item.second.size() <= 64);
    }
    // The client's end before a whole line.
    PortClient ended(agent);
    ended.send("PORT 8");
    ended.shutdown_sending();
    CHECK(ended.line() == "ERR bad request: the connection ended before a request line\n");
    CHECK(ended.rest(5s).bytes == 0);
    // `PORT 08` and the like reached no server.
    CHECK(server.accepted() == 0);
    // The relay still serves a good line.
    PortClient client = relay_to(agent, server.port());
    client.send("fine\n");
    CHECK(client.line() == "fine\n");
}

TEST_CASE("ports: a request line that does not come within 10 s is refused")
{
    Agent agent;
    const auto start = Clock::now();
    PortClient slow(agent);
    slow.send("PORT 8");
    // The deadline is not moved by bytes that do come.
    std::this_thread::sleep_for(2s);
    slow.send("0");
    const std::string answer = slow.line();
    const auto waited = Clock::now() - start;
    CHECK(answer == "ERR bad request: no request line within 10 s\n");
    CHECK(waited >= 9500ms);
    CHECK(waited < 14s);
    CHECK(slow.rest(5s).bytes == 0);
}

TEST_CASE("ports: the server closing mid-stream ends the client's stream; a reset closes it")
{
    Agent agent;
    const std::string sent = pseudo_random_bytes(1 * mib, 3);
    TcpServer closes(AF_INET, [&sent](int fd) { send_all(fd, sent); });
    TcpServer resets(AF_INET, [](int fd) {
        char byte;
        ::recv(fd, &byte, 1, 0);
        const linger abort{1, 0};
        ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort, sizeof(abort));
    });

    PortClient client = relay_to(agent, closes.port());
    const Received got = client.rest();
    CHECK(got.ended);
    CHECK(got.bytes == sent.size());
    CHECK(got.hash == fnv1a(sent));

    PortClient reset = relay_to(agent, resets.port());
    reset.send("x");
    CHECK(reset.rest(5s).bytes == 0);
    // Not just the one direction's end: the relay closed the connection altogether, so what
    // the client sends now has nowhere to go.
    const auto deadline = Clock::now() + 5s;
    ssize_t n = 0;
    while ((n = ::send(reset.fd(), "y", 1, MSG_NOSIGNAL)) > 0 && Clock::now() < deadline)
        std::this_thread::sleep_for(10ms);
    const int err = errno;
    CHECK(n < 0);
    CHECK(err == EPIPE);
}

TEST_CASE("ports: the client closing is seen by the server as end-of-file")
{
    Agent agent;
    std::promise<Received> seen;
    TcpServer server(AF_INET, [&seen](int fd) { seen.set_value(receive_all(fd)); });
    auto future = seen.get_future();

    PortClient client = relay_to(agent, server.port());
    client.send("goodbye");
    client.close();
    REQUIRE(future.wait_for(5s) == std::future_status::ready);
    const Received got = future.get();
    CHECK(got.ended);
    CHECK(got.text == "goodbye");
}

TEST_CASE("ports: half-close: the client's end reaches the server, whose answer still comes back")
{
    Agent agent;
    // Answers, once its client has sent everything, with what it counted.
    TcpServer server(AF_INET, [](int fd) {
        const Received got = receive_all(fd);
        if (got.ended)
            send_all(fd, std::to_string(got.bytes) + " bytes, hash " + std::to_string(got.hash) + "\n");
    });
    const std::string request = pseudo_random_bytes(2 * mib, 4);

    PortClient client = relay_to(agent, server.port());
    client.send(request);
    client.shutdown_sending();
    CHECK(client.line() == std::to_string(request.size()) + " bytes, hash " + std::to_string(fnv1a(request)) + "\n");
    CHECK(client.rest().ended);
}

TEST_CASE("ports: 64 MiB each way, unchanged")
{
    Agent agent;
    const std::string up = pseudo_random_bytes(64 * mib, 1);
    const std::string down = pseudo_random_bytes(64 * mib, 2);
    std::promise<Received> server_got;
    TcpServer server(AF_INET, [&](int fd) {
        std::thread sender([&] {
            send_all(fd, down);
            ::shutdown(fd, SHUT_WR);
        });
        server_got.set_value(receive_all(fd, 0));
        sender.join();
    });
    auto at_server = server_got.get_future();

    PortClient client = relay_to(agent, server.port());
    std::atomic<bool> sent{false};
    std::thread sender([&] {
        sent = send_all(client.fd(), up);
        ::shutdown(client.fd(), SHUT_WR);
    });
    const Received at_client = client.rest(120s);
    sender.join();
    CHECK(sent);
    CHECK(at_client.ended);
    CHECK(at_client.bytes == down.size());
    CHECK(at_client.hash == fnv1a(down));
    REQUIRE(at_server.wait_for(30s) == std::future_status::ready);
    const Received got = at_server.get();
    CHECK(got.ended);
    CHECK(got.bytes == up.size());
    CHECK(got.hash == fnv1a(up));
}

TEST_CASE("ports: 50 connections at once")
{
    Agent agent;
    TcpServer server(AF_INET, echo);
    std::vector<PortClient> clients;
    for (int i = 0; i < 50; ++i) {
        clients.emplace_back(agent);
        clients.back().send("PORT " + std::to_string(server.port()) + "\n");
    }
    for (PortClient& client : clients)
        REQUIRE(client.line() == "OK\n");
    for (size_t i = 0; i < clients.size(); ++i)
        clients[i].send("connection " + std::to_string(i) + "\n");
    for (size_t i = clients.size(); i-- > 0;)
        CHECK(clients[i].line() == "connection " + std::to_string(i) + "\n");
    CHECK(server.peak() == 50);
    for (PortClient& client : clients) {
        client.shutdown_sending();
        CHECK(client.rest().ended);
    }
}

TEST_CASE("ports: a slow reader stalls only its own connection")
{
    Agent agent;
    const std::string flood = pseudo_random_bytes(64 * mib, 5);
    std::atomic<size_t> flooded{0};
    TcpServer source(AF_INET, [&](int fd) {
        for (std::string_view left = flood; !left.empty();) {
            const ssize_t n = ::send(fd, left.data(), std::min<size_t>(left.size(), 64 * 1024), MSG_NOSIGNAL);
            if (n <= 0)
                return;
            flooded += static_cast<size_t>(n);
            left.remove_prefix(static_cast<size_t>(n));
        }
    });
    TcpServer server(AF_INET, echo);

    // Asks for the flood and reads none of it yet.
    PortClient slow = relay_to(agent, source.port());

    const std::string exchanged = pseudo_random_bytes(8 * mib, 6);
    const auto start = Clock::now();
    PortClient other = relay_to(agent, server.port());
    std::thread sender([&] {
        send_all(other.fd(), exchanged);
        ::shutdown(other.fd(), SHUT_WR);
    });
    const Received back = other.rest();
    sender.join();
    CHECK(back.bytes == exchanged.size());
    CHECK(back.hash == fnv1a(exchanged));
    CHECK(Clock::now() - start < 15s);

    // The flood waits in the buffers along the way, the relay's at most 64 KiB of it.
    CHECK(flooded.load() < flood.size());
    const Received flooded_in = slow.rest(60s);
    CHECK(flooded_in.bytes == flood.size());
    CHECK(flooded_in.hash == fnv1a(flood));
}

TEST_CASE("ports: a client that leaves with bytes in flight: they all arrive, and the wait costs no CPU")
{
    Agent agent;
    std::promise<void> go;
    std::shared_future<void> read_now = go.get_future().share();
    std::promise<Received> server_got;
    TcpServer server(AF_INET, [&server_got, read_now](int fd) {
        // A server slow to read: it starts once the test says so.
        read_now.wait();
        server_got.set_value(receive_all(fd, 0));
    });
    auto at_server = server_got.get_future();

    // The client sends until every buffer on the way is full, and closes: the relay holds
    // bytes for the server on one side and a socket whose peer is gone on the other.
    PortClient client = relay_to(agent, server.port());
    const std::string chunk = pseudo_random_bytes(64 * 1024, 9);
    uint64_t sent_hash = fnv1a("");
    size_t sent = 0;
    for (;;) {
        const ssize_t n = ::send(client.fd(), chunk.data(), chunk.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
            sent_hash = fnv1a(std::string_view(chunk.data(), static_cast<size_t>(n)), sent_hash);
            sent += static_cast<size_t>(n);
            continue;
        }
        REQUIRE(errno == EAGAIN);
        pollfd pfd{client.fd(), POLLOUT, 0};
        if (::poll(&pfd, 1, 300) == 0)
            break;
    }
    client.close();

    std::this_thread::sleep_for(300ms);
    const long before = cpu_ticks_of(agent.pid());
    std::this_thread::sleep_for(1s);
    const long spent_ms = (cpu_ticks_of(agent.pid()) - before) * 1000 / ::sysconf(_SC_CLK_TCK);
    CHECK(spent_ms < 200);

    go.set_value();
    REQUIRE(at_server.wait_for(30s) == std::future_status::ready);
    const Received got = at_server.get();
    CHECK(got.ended);
    CHECK(got.bytes == sent);
    CHECK(got.hash == sent_hash);
}

TEST_CASE("ports: at most 1024 connections at once; the next is refused, and a freed place serves again")
{
    // The agent inherits the limit: it needs two descriptors a connection, the test one.
    rlimit files{};
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &files) == 0);
    files.rlim_cur = std::max<rlim_t>(files.rlim_cur, std::min<rlim_t>(files.rlim_max, 4096));
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &files) == 0);
    REQUIRE_MESSAGE(files.rlim_cur >= 2200, "this test needs 2200 descriptors (ulimit -n)");

    Agent agent;
    TcpServer server(AF_INET, echo);
    // Still to send their request lines: each holds its place until it does, or for 10 s.
    std::vector<PortClient> waiting;
    for (int i = 0; i < 1024; ++i)
        waiting.emplace_back(agent);
    // The 1024 are accepted in order; the next one's answer comes only once they all have been.
    PortClient refused(agent);
    CHECK(refused.line() == "ERR too many connections (1024 at once)\n");
    CHECK(refused.rest(5s).bytes == 0);

    waiting.front().send("PORT " + std::to_string(server.port()) + "\n");
    CHECK(waiting.front().line() == "OK\n");
    waiting.erase(waiting.begin() + 1, waiting.end());
    // The relay's threads notice their clients' end and give their places back.
    const auto deadline = Clock::now() + 10s;
    std::string answer;
    do {
        PortClient again(agent);
        again.send("PORT " + std::to_string(server.port()) + "\n");
        answer = again.line();
        if (answer != "OK\n")
            std::this_thread::sleep_for(50ms);
    } while (answer != "OK\n" && Clock::now() < deadline);
    CHECK(answer == "OK\n");
    waiting.front().send("first\n");
    CHECK(waiting.front().line() == "first\n");
}

TEST_CASE("ports: 1000 connections leave no descriptor or thread behind")
{
    Agent agent;
    TcpServer server(AF_INET, echo);
    const UnusedPort unused;
    const std::string fds = "/proc/" + std::to_string(agent.pid()) + "/fd";
    const std::string tasks = "/proc/" + std::to_string(agent.pid()) + "/task";
    {
        PortClient warm_up = relay_to(agent, server.port());
    }
    std::this_thread::sleep_for(200ms);
    const size_t fds_before = entries_in(fds);
    const size_t tasks_before = entries_in(tasks);

    for (int i = 0; i < 1000; ++i) {
        CAPTURE(i);
        if (i % 10 == 3) {
            REQUIRE(refusal_of(agent, "PORT 0\n").starts_with("ERR bad request: "));
        } else if (i % 10 == 7) {
            REQUIRE(refusal_of(agent, "PORT " + std::to_string(unused.port) + "\n").starts_with("ERR nothing listens"));
        } else {
            PortClient client = relay_to(agent, server.port());
            client.send("ping " + std::to_string(i) + "\n");
            REQUIRE(client.line() == "ping " + std::to_string(i) + "\n");
            if (i % 2 == 0) {
                client.shutdown_sending();
                REQUIRE(client.rest().ended);
            }
        }
    }

    // The relay's threads close their sockets as they end, a moment after the client's last.
    const auto deadline = Clock::now() + 10s;
    while ((entries_in(fds) > fds_before || entries_in(tasks) > tasks_before) && Clock::now() < deadline)
        std::this_thread::sleep_for(20ms);
    CHECK(entries_in(fds) <= fds_before);
    CHECK(entries_in(tasks) <= tasks_before);
    CHECK(agent.alive());
}

TEST_CASE("ports: tool calls go on beside relayed connections, and inherit none of their sockets")
{
    Agent agent;
    TcpServer server(AF_INET, echo);
    PortClient relayed = relay_to(agent, server.port());
    PortClient waiting(agent);  // still to send its request line

    Client client(agent);
    const Json listed = client.exec({{"argv", {"sh", "-c", "ls -l /proc/self/fd/"}}});
    REQUIRE(listed["exit_code"] == 0);
    const std::string fd_list = bytes_of(listed, "stdout");
    CHECK(fd_list.find("pipe:") != std::string::npos);
    CHECK(fd_list.find("socket:") == std::string::npos);

    relayed.send("still here\n");
    CHECK(relayed.line() == "still here\n");
    waiting.send("PORT " + std::to_string(server.port()) + "\n");
    CHECK(waiting.line() == "OK\n");
}
