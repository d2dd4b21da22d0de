#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "core/event_loop.hpp"
#include "common/fd.hpp"

using namespace agentvm;
using namespace std::chrono_literals;

namespace agentvm {

// Reaches into the loop to submit an SQE of any opcode through the ring EventLoop built,
// on the path its own I/O takes.
struct EventLoopTestAccess {
    static int32_t submit_raw(EventLoop& loop, std::function<void(io_uring_sqe*)> prep)
    {
        int32_t result = 1;  // stdout's fd, which no opcode below can return
        loop.submit_io([&](int32_t res) { result = res; }, std::move(prep));
        REQUIRE(loop.drain(2s));
        return result;
    }
    static io_uring& ring(EventLoop& loop) { return loop.ring_; }
};

} // namespace agentvm

namespace {

Fd make_memfd()
{
    Fd fd(::memfd_create("event-loop-test", MFD_CLOEXEC));
    REQUIRE(fd);
    return fd;
}

Fd make_eventfd()
{
    Fd fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    REQUIRE(fd);
    return fd;
}

void signal_eventfd(int fd)
{
    const uint64_t one = 1;
    REQUIRE(::write(fd, &one, sizeof one) == sizeof one);
}

// Runs the loop until another thread stops it after `after`.
void run_for(EventLoop& loop, std::chrono::milliseconds after)
{
    std::thread stopper([&] {
        std::this_thread::sleep_for(after);
        loop.stop();
    });
    loop.run();
    stopper.join();
}

iovec iov_of(std::string& s)
{
    return {s.data(), s.size()};
}

} // namespace

TEST_CASE("event loop: writev and readv at offsets")
{
    EventLoop loop;
    Fd file = make_memfd();

    std::string a = "hello, ", b = "world";
    iovec out[] = {iov_of(a), iov_of(b)};
    std::string c = "far";
    iovec out_far[] = {iov_of(c)};
    std::vector<int32_t> results;
    loop.writev(file.get(), out, 2, 100, [&](int32_t res) { results.push_back(res); });
    loop.writev(file.get(), out_far, 1, 8192, [&](int32_t res) { results.push_back(res); });
    CHECK(loop.in_flight() == 2);
    loop.drain();
    CHECK(loop.in_flight() == 0);
    CHECK(results == std::vector<int32_t>{12, 3});

    std::string x(5, '\0'), y(7, '\0'), z(3, '\0');
    iovec in[] = {iov_of(x), iov_of(y)};
    iovec in_far[] = {iov_of(z)};
    results.clear();
    loop.readv(file.get(), in, 2, 100, [&](int32_t res) { results.push_back(res); });
    loop.readv(file.get(), in_far, 1, 8192, [&](int32_t res) { results.push_back(res); });
    loop.drain();
    CHECK(results == std::vector<int32_t>{12, 3});
    CHECK(x == "hello");
    CHECK(y == ", world");
    CHECK(z == "far");

    // Past the end: a short read, reported as such.
    std::string tail(10, '\0');
    iovec in_tail[] = {iov_of(tail)};
    int32_t tail_res = -1;
    loop.readv(file.get(), in_tail, 1, 8192 + 1, [&](int32_t res) { tail_res = res; });
    loop.drain();
    CHECK(tail_res == 2);
}

TEST_CASE("event loop: errors arrive as -errno and fsync completes")
{
    EventLoop loop;
    Fd file = make_memfd();
    std::string buf(4, 'q');
    iovec iov[] = {iov_of(buf)};
    int32_t bad = 0, synced = -1;
    loop.readv(-1, iov, 1, 0, [&](int32_t res) { bad = res; });
    loop.fsync(file.get(), [&](int32_t res) { synced = res; });
    loop.drain();
    CHECK(bad == -EBADF);
    CHECK(synced == 0);
}

TEST_CASE("event loop: a watch fires once per eventfd write and stops after unwatch")
{
    EventLoop loop;
    Fd efd = make_eventfd();
    int fired = 0;
    loop.watch_readable(efd.get(), [&] {
        uint64_t v = 0;
        REQUIRE(::read(efd.get(), &v, sizeof v) == sizeof v);
        ++fired;
        loop.stop();
    });

    signal_eventfd(efd.get());
    loop.run();
    CHECK(fired == 1);

    run_for(loop, 50ms);  // consumed readiness does not fire again
    CHECK(fired == 1);

    signal_eventfd(efd.get());
    loop.run();
    CHECK(fired == 2);

    loop.unwatch(efd.get());
    signal_eventfd(efd.get());
    run_for(loop, 50ms);
    CHECK(fired == 2);
    uint64_t v = 0;
    CHECK(::read(efd.get(), &v, sizeof v) == sizeof v);  // nobody consumed it
    CHECK(v == 1);

    // The fd can be watched again after unwatch.
    loop.watch_readable(efd.get(), [&] {
        uint64_t w = 0;
        REQUIRE(::read(efd.get(), &w, sizeof w) == sizeof w);
        fired += 10;
        loop.stop();
    });
    signal_eventfd(efd.get());
    loop.run();
    CHECK(fired == 12);
}

TEST_CASE("event loop: watching an fd twice is an error")
{
    EventLoop loop;
    Fd efd = make_eventfd();
    loop.watch_readable(efd.get(), [] {});
    CHECK_THROWS_AS(loop.watch_readable(efd.get(), [] {}), Error);
}

TEST_CASE("event loop: a callback may unwatch its own fd and others")
{
    EventLoop loop;
    Fd a = make_eventfd();
    Fd b = make_eventfd();
    int a_fired = 0, b_fired = 0;
    // Whichever runs first unwatches both, with the other's completion possibly already
    // in the same batch: only one callback may run.
    loop.watch_readable(a.get(), [&] {
        ++a_fired;
        loop.unwatch(a.get());
        loop.unwatch(b.get());
        loop.stop();
    });
    loop.watch_readable(b.get(), [&] {
        ++b_fired;
        loop.unwatch(b.get());
        loop.unwatch(a.get());
        loop.stop();
    });
    signal_eventfd(a.get());
    signal_eventfd(b.get());
    loop.run();
    CHECK(a_fired + b_fired == 1);
    run_for(loop, 20ms);
    CHECK(a_fired + b_fired == 1);
}

TEST_CASE("event loop: unwatch before the poll was ever submitted, then destroy")
{
    Fd efd = make_eventfd();
    EventLoop loop;
    loop.watch_readable(efd.get(), [] { FAIL("unwatched callback ran"); });
    loop.unwatch(efd.get());
    signal_eventfd(efd.get());
    run_for(loop, 20ms);
}

TEST_CASE("event loop: stop() from another thread ends run(), and a stop before run() counts")
{
    EventLoop loop;
    const auto start = std::chrono::steady_clock::now();
    run_for(loop, 30ms);
    CHECK(std::chrono::steady_clock::now() - start >= 30ms);

    loop.stop();
    loop.run();  // returns at once
}

TEST_CASE("event loop: the first exception from a callback leaves run()")
{
    EventLoop loop;
    Fd file = make_memfd();
    std::string buf(4, 'x');
    iovec iov[] = {iov_of(buf)};
    int later = 0;
    loop.writev(file.get(), iov, 1, 0, [](int32_t) { throw std::runtime_error("first"); });
    loop.writev(file.get(), iov, 1, 4, [&](int32_t) { ++later; });
    CHECK_THROWS_WITH_AS(loop.run(), "first", std::runtime_error);

    // The loop still works: what was left runs on the next turn.
    loop.drain();
    CHECK(later == 1);
    CHECK(loop.in_flight() == 0);

    Fd efd = make_eventfd();
    loop.watch_readable(efd.get(), [&] {
        uint64_t v = 0;
        REQUIRE(::read(efd.get(), &v, sizeof v) == sizeof v);
        throw std::runtime_error("from a watch");
    });
    signal_eventfd(efd.get());
    CHECK_THROWS_WITH_AS(loop.run(), "from a watch", std::runtime_error);
    // The watch is still armed after its callback threw.
    signal_eventfd(efd.get());
    CHECK_THROWS_WITH_AS(loop.run(), "from a watch", std::runtime_error);
}

TEST_CASE("event loop: drain() waits for I/O that completes later")
{
    EventLoop loop;
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    Fd rd(fds[0]), wr(fds[1]);

    std::string buf(3, '\0');
    iovec iov[] = {iov_of(buf)};
    int32_t got = -1;
    loop.readv(rd.get(), iov, 1, static_cast<uint64_t>(-1), [&](int32_t res) { got = res; });
    CHECK(loop.in_flight() == 1);

    const auto start = std::chrono::steady_clock::now();
    std::thread writer([&] {
        std::this_thread::sleep_for(50ms);
        REQUIRE(::write(wr.get(), "abc", 3) == 3);
    });
    loop.drain();
    writer.join();
    CHECK(std::chrono::steady_clock::now() - start >= 50ms);
    CHECK(got == 3);
    CHECK(buf == "abc");
    CHECK(loop.in_flight() == 0);
}

TEST_CASE("event loop: drain() cancels I/O still waiting after its patience, and never hangs")
{
    EventLoop loop;
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    Fd rd(fds[0]), wr(fds[1]);
    REQUIRE(::fcntl(rd.get(), F_SETFL, O_NONBLOCK) == 0);

    // Nobody ever writes: one read waits in the kernel, one (O_NONBLOCK) in a readiness poll.
    std::string a(3, '\0'), b(3, '\0');
    iovec ia[] = {iov_of(a)}, ib[] = {iov_of(b)};
    std::vector<int32_t> results;
    Fd other_rd, other_wr;
    {
        int more[2];
        REQUIRE(::pipe2(more, O_CLOEXEC) == 0);
        other_rd = Fd(more[0]);
        other_wr = Fd(more[1]);
    }
    loop.readv(other_rd.get(), ia, 1, static_cast<uint64_t>(-1), [&](int32_t res) { results.push_back(res); });
    loop.readv(rd.get(), ib, 1, static_cast<uint64_t>(-1), [&](int32_t res) { results.push_back(res); });
    CHECK(loop.in_flight() == 2);

    const auto start = std::chrono::steady_clock::now();
    CHECK(loop.drain(100ms));
    const auto took = std::chrono::steady_clock::now() - start;
    CHECK(took >= 100ms);
    CHECK(took < 2s);
    CHECK(loop.in_flight() == 0);
    CHECK(results == std::vector<int32_t>{-ECANCELED, -ECANCELED});

    // The loop goes on working after a cancelling drain.
    std::string c(2, '\0');
    iovec ic[] = {iov_of(c)};
    int32_t got = -1;
    REQUIRE(::write(wr.get(), "ok", 2) == 2);
    loop.readv(rd.get(), ic, 1, static_cast<uint64_t>(-1), [&](int32_t res) { got = res; });
    CHECK(loop.drain(100ms));
    CHECK(got == 2);
    CHECK(c == "ok");
}

TEST_CASE("event loop: many more operations than ring entries all complete")
{
    constexpr unsigned ops = 1000;
    EventLoop loop(8);
    Fd file = make_memfd();

    std::vector<uint32_t> values(ops);
    std::vector<iovec> iovs(ops);
    std::vector<int32_t> results(ops, -1);
    for (unsigned i = 0; i < ops; ++i) {
        values[i] = i * 7 + 1;
        iovs[i] = {&values[i], sizeof values[i]};
        loop.writev(file.get(), &iovs[i], 1, i * sizeof(uint32_t),
                    [&results, i](int32_t res) { results[i] = res; });
    }
    CHECK(loop.in_flight() == ops);
    loop.drain();
    CHECK(loop.in_flight() == 0);
    for (unsigned i = 0; i < ops; ++i)
        REQUIRE(results[i] == sizeof(uint32_t));

    std::vector<uint32_t> back(ops);
    REQUIRE(::pread(file.get(), back.data(), ops * sizeof(uint32_t), 0) ==
            static_cast<ssize_t>(ops * sizeof(uint32_t)));
    CHECK(back == values);
}

TEST_CASE("event loop: completions can submit more work while run() is going")
{
    EventLoop loop(4);
    Fd file = make_memfd();
    std::string buf(1, 'c');
    iovec iov[] = {iov_of(buf)};
    int done = 0;
    std::function<void(int32_t)> next = [&](int32_t res) {
        REQUIRE(res == 1);
        if (++done == 100)
            loop.stop();
        else
            loop.writev(file.get(), iov, 1, static_cast<uint64_t>(done), next);
    };
    loop.writev(file.get(), iov, 1, 0, next);
    loop.run();
    CHECK(done == 100);
    struct stat st {};
    REQUIRE(::fstat(file.get(), &st) == 0);
    CHECK(st.st_size == 100);
}

TEST_CASE("event loop: destroying the loop with I/O and watches pending waits, runs nothing")
{
    Fd file = make_memfd();
    Fd efd = make_eventfd();
    std::string buf(64, 'd');
    iovec iov[] = {iov_of(buf)};
    int ran = 0;
    {
        EventLoop loop(4);
        loop.watch_readable(efd.get(), [&] { ++ran; });
        for (int i = 0; i < 20; ++i)
            loop.writev(file.get(), iov, 1, static_cast<uint64_t>(i) * 64, [&](int32_t) { ++ran; });
        signal_eventfd(efd.get());
    }
    CHECK(ran == 0);
    struct stat st {};
    REQUIRE(::fstat(file.get(), &st) == 0);
    CHECK(st.st_size == 20 * 64);  // the writes were carried out before the ring went away
}

TEST_CASE("event loop: the ring refuses every opcode and registration the loop does not use")
{
    EventLoop loop;

    // What the I/O thread's seccomp filter forbids as system calls, tried as SQEs.
    const int32_t opened = EventLoopTestAccess::submit_raw(loop, [](io_uring_sqe* sqe) {
        io_uring_prep_openat(sqe, AT_FDCWD, "/etc/passwd", O_RDONLY | O_CLOEXEC, 0);
    });
    if (opened >= 0)
        ::close(opened);
    CHECK(opened == -EACCES);

    // A listening socket that a permitted connect would reach.
    Fd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    Fd client(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(listener);
    REQUIRE(client);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string name = "agentvm-event-loop-test-" + std::to_string(::getpid());
    std::memcpy(addr.sun_path + 1, name.data(), name.size());  // abstract: nothing on disk
    const auto addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    REQUIRE(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), addr_len) == 0);
    REQUIRE(::listen(listener.get(), 1) == 0);
    CHECK(EventLoopTestAccess::submit_raw(loop, [&](io_uring_sqe* sqe) {
              io_uring_prep_connect(sqe, client.get(), reinterpret_cast<sockaddr*>(&addr), addr_len);
          }) == -EACCES);

    io_uring_probe* probe = io_uring_get_probe();
    REQUIRE(probe);
    const bool kernel_has_socket = io_uring_opcode_supported(probe, IORING_OP_SOCKET);
    io_uring_free_probe(probe);
    if (kernel_has_socket) {
        const int32_t socket = EventLoopTestAccess::submit_raw(
            loop, [](io_uring_sqe* sqe) { io_uring_prep_socket(sqe, AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0, 0); });
        if (socket >= 0)
            ::close(socket);
        CHECK(socket == -EACCES);
    }

    // liburing waits with a timeout in io_uring_enter's argument where the kernel has
    // IORING_FEAT_EXT_ARG, so the ring has no use for IORING_OP_TIMEOUT there.
    if (EventLoopTestAccess::ring(loop).features & IORING_FEAT_EXT_ARG) {
        __kernel_timespec ts{};
        ts.tv_nsec = 1'000'000;
        CHECK(EventLoopTestAccess::submit_raw(loop, [&](io_uring_sqe* sqe) { io_uring_prep_timeout(sqe, &ts, 0, 0); }) ==
              -EACCES);
    }

    // No registration after set-up: no fixed files, no personality (other credentials).
    Fd file = make_memfd();
    const int file_fd = file.get();
    CHECK(io_uring_register_files(&EventLoopTestAccess::ring(loop), &file_fd, 1) == -EACCES);
    CHECK(io_uring_register_personality(&EventLoopTestAccess::ring(loop)) == -EACCES);

    // Everything the loop does itself still works on the same ring: writev, readv, fsync,
    // a watch (POLL_ADD) and cancelling I/O (ASYNC_CANCEL).
    std::string out = "allowed";
    iovec iov_out[] = {iov_of(out)};
    int32_t wrote = -1, synced = -1, got = -1;
    loop.writev(file.get(), iov_out, 1, 0, [&](int32_t res) { wrote = res; });
    loop.fsync(file.get(), [&](int32_t res) { synced = res; });
    loop.drain();
    std::string in(out.size(), '\0');
    iovec iov_in[] = {iov_of(in)};
    loop.readv(file.get(), iov_in, 1, 0, [&](int32_t res) { got = res; });
    loop.drain();
    CHECK(wrote == static_cast<int32_t>(out.size()));
    CHECK(synced == 0);
    CHECK(got == static_cast<int32_t>(out.size()));
    CHECK(in == out);

    Fd efd = make_eventfd();
    int fired = 0;
    loop.watch_readable(efd.get(), [&] {
        uint64_t v = 0;
        REQUIRE(::read(efd.get(), &v, sizeof v) == sizeof v);
        ++fired;
        loop.stop();
    });
    signal_eventfd(efd.get());
    loop.run();
    CHECK(fired == 1);

    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    Fd rd(fds[0]), wr(fds[1]);
    std::string never(1, '\0');
    iovec iov_never[] = {iov_of(never)};
    int32_t cancelled = 1;
    loop.readv(rd.get(), iov_never, 1, static_cast<uint64_t>(-1), [&](int32_t res) { cancelled = res; });
    loop.cancel_io(rd.get());
    CHECK(loop.drain(2s));
    CHECK(cancelled == -ECANCELED);
}
