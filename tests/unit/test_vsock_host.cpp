// The host end of vsock (VsockHost) against real Unix sockets and a real event loop, without
// a guest: the device calls on_connect_request() exactly as the test does here, under its
// mutex. What is checked is what a guest flooding the host with connections must not achieve:
// running the VMM out of descriptors, stopping it with an error, or keeping it from ending.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "devices/virtio_vsock.hpp"
#include "core/event_loop.hpp"
#include "common/fd.hpp"
#include "vmm/seccomp.hpp"
#include "vmm/vsock_host.hpp"

using namespace agentvm;
using namespace std::chrono_literals;

namespace {

Fd unix_listener(const std::string& path)
{
    Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(fd);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    REQUIRE(path.size() < sizeof(addr.sun_path));
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    REQUIRE(::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(::listen(fd.get(), 4096) == 0);
    return fd;
}

Fd unix_client(const std::string& path)
{
    Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(fd);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    REQUIRE(::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0);
    return fd;
}

// Runs the loop's completions for a moment (the host's callbacks run on the loop thread).
void turn(EventLoop& loop, std::chrono::milliseconds how_long = 50ms)
{
    std::thread stopper([&] {
        std::this_thread::sleep_for(how_long);
        loop.stop();
    });
    loop.run();
    stopper.join();
}

// Lowers the soft RLIMIT_NOFILE for one test and puts it back.
struct FdLimit {
    rlimit saved{};
    explicit FdLimit(rlim_t soft)
    {
        REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
        rlimit lower = saved;
        lower.rlim_cur = soft;
        REQUIRE(::setrlimit(RLIMIT_NOFILE, &lower) == 0);
    }
    ~FdLimit() { ::setrlimit(RLIMIT_NOFILE, &saved); }
};

// A VsockHost with its socket in a fresh directory, and a host program listening on the
// guest's host port 5000 that accepts nothing and sends nothing.
struct Rig {
    std::string dir;
    EventLoop loop;
    std::optional<VsockHost> host;
    std::optional<VirtioVsock> device;
    Fd listener;

    explicit Rig(const std::string& name = "v.sock")
    {
        // As in agentvm (cli/main.cpp): a write to a socket shut down under it fails with EPIPE.
        ::signal(SIGPIPE, SIG_IGN);
        char templ[] = "/tmp/vsock-host-test.XXXXXX";
        REQUIRE(::mkdtemp(templ));
        dir = templ;
        host.emplace(loop, dir + "/" + name);
        device.emplace(*host);
        host->attach(*device);
        if (dir.size() + name.size() + 6 < sizeof(sockaddr_un::sun_path))
            listener = unix_listener(dir + "/" + name + "_5000");
    }
    ~Rig()
    {
        host->close_all();
        loop.drain(1s);
        device.reset();
        host.reset();
        std::filesystem::remove_all(dir);
    }

    bool guest_connects(uint32_t guest_port, uint32_t host_port = 5000)
    {
        std::lock_guard lock(device->mutex());
        return host->on_connect_request({host_port, guest_port});
    }
};

// Every descriptor left below the soft limit, held until the vector goes.
std::vector<Fd> use_up_descriptors()
{
    std::vector<Fd> hog;
    for (;;) {
        Fd fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
        if (!fd) {
            REQUIRE(errno == EMFILE);
            return hog;
        }
        hog.push_back(std::move(fd));
    }
}

// CPU time this process has used.
std::chrono::microseconds cpu_time()
{
    rusage usage{};
    REQUIRE(::getrusage(RUSAGE_SELF, &usage) == 0);
    const auto us = [](const timeval& t) { return std::chrono::seconds(t.tv_sec) + std::chrono::microseconds(t.tv_usec); };
    return std::chrono::duration_cast<std::chrono::microseconds>(us(usage.ru_utime) + us(usage.ru_stime));
}

} // namespace

TEST_CASE("vsock host: the cap on open streams follows the soft descriptor limit, with a reserve")
{
    CHECK(VsockHost::stream_cap_for(1024) == 1024 - 256);
    CHECK(VsockHost::stream_cap_for(65536) == 65536 - 256);
    // A jail may set a low limit: half of it still goes to everything else.
    CHECK(VsockHost::stream_cap_for(100) == 50);
    CHECK(VsockHost::stream_cap_for(1) == 1);
    CHECK(VsockHost::stream_cap_for(0) == 0);

    // Read when asked to (the VM calls it again as it starts running), not at every request.
    EventLoop loop;
    VsockHost host(loop, std::nullopt);
    FdLimit limit(200);
    CHECK(host.stream_cap() != 100);
    host.update_stream_cap();
    CHECK(host.stream_cap() == 100);
}

TEST_CASE("vsock host: guest connections past the cap are refused, and accepted again once streams close")
{
    Rig rig;
    FdLimit limit(128);  // a cap of 64 streams
    rig.host->update_stream_cap();
    const size_t cap = rig.host->stream_cap();
    REQUIRE(cap == 64);
    for (uint32_t port = 1; port <= cap; ++port)
        REQUIRE(rig.guest_connects(port));
    CHECK(rig.host->open_streams() == cap);
    // The next ones are refused (the device answers RST), and nothing is thrown.
    CHECK_FALSE(rig.guest_connects(1000));
    CHECK_FALSE(rig.guest_connects(1001));
    CHECK(rig.host->open_streams() == cap);

    // The guest closes two: their descriptors go once their reads have completed.
    {
        std::lock_guard lock(rig.device->mutex());
        rig.host->on_closed({5000, 1});
        rig.host->on_closed({5000, 2});
    }
    turn(rig.loop);
    CHECK(rig.host->open_streams() == cap - 2);
    CHECK(rig.guest_connects(1002));
    CHECK(rig.guest_connects(1003));
    CHECK_FALSE(rig.guest_connects(1004));
}

TEST_CASE("vsock host: a guest connection with no descriptor left (EMFILE) is refused, and the host goes on")
{
    Rig rig;
    FdLimit limit(256);
    REQUIRE(rig.guest_connects(1));
    // Use up every descriptor below the limit, as something beside the streams might.
    std::vector<Fd> hog = use_up_descriptors();
    rig.host->update_stream_cap();
    CHECK(rig.host->open_streams() < rig.host->stream_cap());
    CHECK_FALSE(rig.guest_connects(2));
    CHECK_FALSE(rig.guest_connects(3));
    hog.clear();
    CHECK(rig.guest_connects(4));
    CHECK(rig.host->open_streams() == 2);
}

TEST_CASE("vsock host: host clients with no descriptor to spare wait in the backlog, without spinning the loop")
{
    Rig rig;
    turn(rig.loop);
    FdLimit limit(256);
    std::vector<Fd> clients;
    for (int i = 0; i < 3; ++i)
        clients.push_back(unix_client(rig.dir + "/v.sock"));
    std::vector<Fd> hog = use_up_descriptors();
    // accept() fails with EMFILE while the listener stays readable: the loop must not retry
    // at once. Half a second of retrying would cost about that much CPU; waiting costs none.
    const auto before = cpu_time();
    turn(rig.loop, 500ms);
    CHECK(cpu_time() - before < 100ms);
    CHECK(rig.host->open_streams() == 0);

    hog.clear();
    turn(rig.loop, 300ms);
    CHECK(rig.host->open_streams() == 3);
}

TEST_CASE("vsock host: a host port whose socket path would be too long is refused, not an error")
{
    // A 100-byte path: "<path>_5000" still fits sun_path (108 bytes with its NUL),
    // "<path>_4294967295" does not.
    const std::string name = std::string(100 - std::string("/tmp/vsock-host-test.XXXXXX/").size(), 'n');
    Rig rig(name);
    CHECK_FALSE(rig.guest_connects(1, 4294967295u));
    CHECK_FALSE(rig.guest_connects(2, 4000000000u));
}

TEST_CASE("vsock host: close_all() ends every stream's I/O, so draining the loop does not wait, and refuses from then on")
{
    Rig rig;
    // Guest streams to a host program that never sends: their reads stay in flight.
    for (uint32_t port = 1; port <= 20; ++port)
        REQUIRE(rig.guest_connects(port));
    // A host client that never finishes its CONNECT line, and one that never starts it.
    Fd quiet = unix_client(rig.dir + "/v.sock");
    Fd halfway = unix_client(rig.dir + "/v.sock");
    REQUIRE(::write(halfway.get(), "CONN", 4) == 4);
    turn(rig.loop);
    // A stream the device let go of while its last bytes wait for a host that does not read
    // (more than a Unix socket buffers).
    {
        std::lock_guard lock(rig.device->mutex());
        const std::vector<uint8_t> bytes(VirtioVsock::conn_buf_alloc, 'x');
        rig.host->on_data({5000, 1}, bytes);
        rig.host->on_shutdown({5000, 1}, VIRTIO_VSOCK_SHUTDOWN_SEND);
        rig.host->on_closed({5000, 1});
    }
    turn(rig.loop);
    CHECK(rig.loop.in_flight() >= 22);
    CHECK(rig.host->open_streams() == 22);

    rig.host->close_all();
    const auto start = std::chrono::steady_clock::now();
    CHECK(rig.loop.drain(10s));
    CHECK(std::chrono::steady_clock::now() - start < 2s);
    CHECK(rig.loop.in_flight() == 0);
    CHECK(rig.host->open_streams() == 0);
    CHECK_FALSE(rig.guest_connects(100));
    CHECK(rig.host->open_streams() == 0);
}

TEST_CASE("vsock host: a driver reset's streams are closed by the loop, not by the thread that reset")
{
    Rig rig;
    REQUIRE(rig.guest_connects(1));
    REQUIRE(rig.guest_connects(2));
    Fd peer1(::accept4(rig.listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    Fd peer2(::accept4(rig.listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    REQUIRE(peer1);
    REQUIRE(peer2);
    turn(rig.loop);

    const std::vector<VsockConnId> ids{{5000, 1}, {5000, 2}};
    // The vCPU threads' filter, which has neither shutdown nor close, lets it through (in a
    // child, which ends without a thread exit, whose system calls are the C library's).
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        install_seccomp(SeccompRole::vcpu);
        {
            std::lock_guard lock(rig.device->mutex());
            rig.host->on_reset(ids);
        }
        ::_exit(0);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);

    // As a vCPU thread writing Status 0 does, under the device's mutex.
    std::thread vcpu([&] {
        std::lock_guard lock(rig.device->mutex());
        rig.host->on_reset(ids);
    });
    vcpu.join();
    // Nothing was shut down yet: the host programs see no end of their streams.
    for (const Fd* peer : {&peer1, &peer2}) {
        pollfd p{peer->get(), POLLIN, 0};
        CHECK(::poll(&p, 1, 0) == 0);
    }
    // The ids are free at once: a new connection of the guest's may reuse one.
    CHECK(rig.guest_connects(1));
    Fd peer3(::accept4(rig.listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    REQUIRE(peer3);

    turn(rig.loop);
    char byte = 0;
    CHECK(::read(peer1.get(), &byte, 1) == 0);
    CHECK(::read(peer2.get(), &byte, 1) == 0);
    CHECK(rig.host->open_streams() == 1);
    pollfd p{peer3.get(), POLLIN, 0};
    CHECK(::poll(&p, 1, 0) == 0);  // the new stream lives on
}
