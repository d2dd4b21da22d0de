// The serial console's way out: the bounded buffer, and the writer that empties it through
// the I/O loop without ever making the guest wait on the console's reader.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <functional>
#include <string>

#include "common/fd.hpp"
#include "core/event_loop.hpp"
#include "devices/console_buffer.hpp"
#include "devices/console_writer.hpp"
#include "devices/serial.hpp"

using namespace agentvm;

namespace {

void guest_print(SerialDevice& dev, const std::string& text)
{
    for (char c : text) {
        const uint8_t b = static_cast<uint8_t>(c);
        dev.bus_write(uart::thr, {&b, 1});
    }
}

// Runs the loop's ready work until done() holds (or it plainly never will).
void spin(EventLoop& loop, const std::function<bool()>& done, int rounds = 10000)
{
    for (int i = 0; i < rounds && !done(); ++i) {
        loop.stop();
        loop.run();
    }
}

struct Pipe {
    Fd rd, wr;
    Pipe()
    {
        int fds[2];
        REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
        rd = Fd(fds[0]);
        wr = Fd(fds[1]);
        // Only the read end: a console fd is whatever the user gave, blocking as a rule.
        REQUIRE(::fcntl(rd.get(), F_SETFL, O_NONBLOCK) == 0);
    }
    std::string read_available()
    {
        std::string text;
        char buf[4096];
        ssize_t n;
        while ((n = ::read(rd.get(), buf, sizeof buf)) > 0)
            text.append(buf, static_cast<size_t>(n));
        return text;
    }
};

} // namespace

TEST_CASE("console buffer: keeps bytes up to its bound, counts the rest, and marks each burst of loss")
{
    ConsoleBuffer buf(4);
    for (uint8_t b : {'a', 'b', 'c', 'd'})
        CHECK_FALSE(buf.push(b));
    CHECK(buf.push('e'));        // the first loss begins a burst
    CHECK_FALSE(buf.push('f'));  // ... which goes on
    CHECK(buf.size() == 4);
    CHECK(buf.dropped() == 2);
    CHECK(buf.take(3) == "abc");  // the oldest bytes, and the burst is over
    CHECK_FALSE(buf.push('g'));
    CHECK_FALSE(buf.push('h'));
    CHECK_FALSE(buf.push('i'));
    CHECK(buf.push('j'));         // a new burst
    CHECK(buf.dropped() == 3);
    CHECK(buf.take(100) == "dghi");
    CHECK(buf.take(100).empty());
    CHECK(buf.size() == 0);
}

TEST_CASE("console writer: output reaches the fd in order through the loop")
{
    EventLoop loop;
    Pipe pipe;
    SerialDevice dev([](bool) {});
    ConsoleWriter writer(loop, dev, pipe.wr.get());
    std::string got;
    guest_print(dev, "line one\r\n");
    guest_print(dev, "line two\r\n$ ");
    const uint8_t ier = 0;
    dev.bus_write(uart::ier, {&ier, 1});  // the guest pauses: the prompt goes out too
    spin(loop, [&] {
        got += pipe.read_available();
        return got.size() == 22;
    });
    CHECK(got == "line one\r\nline two\r\n$ ");

    // What the loop had no turn to write before the VM stopped goes out at the end.
    guest_print(dev, "reboot: Power down\r\n");
    writer.stop();
    loop.drain();
    writer.finish();
    CHECK(pipe.read_available() == "reboot: Power down\r\n");
    CHECK(writer.dropped() == 0);
}

TEST_CASE("console writer: a reader who stops reading never blocks the guest; every byte is written or counted")
{
    EventLoop loop;
    Pipe pipe;
    REQUIRE(::fcntl(pipe.wr.get(), F_SETPIPE_SZ, 4096) >= 0);
    SerialDevice dev([](bool) {});
    ConsoleWriter writer(loop, dev, pipe.wr.get());
    // Far more than the pipe, the writer's chunk and the device's buffer hold together.
    const std::string flood = std::string(4 * SerialDevice::output_capacity, 'f') + "\n";
    guest_print(dev, flood);  // returns: the transmitting vCPU never waits on the reader
    spin(loop, [&] { return loop.in_flight() > 0; });  // a write now waits on the full pipe
    guest_print(dev, flood);
    CHECK(dev.output_dropped() > 0);

    // Stopping cancels the stuck write and finish() gives up on the reader instead of waiting.
    writer.stop();
    CHECK(loop.drain());
    writer.finish();
    const std::string written = pipe.read_available();
    CHECK(written.size() < 2 * flood.size());
    CHECK(written.size() + writer.dropped() == 2 * flood.size());
    CHECK(written == flood.substr(0, written.size()));
}

TEST_CASE("console writer: a console whose reader went away is not fatal")
{
    EventLoop loop;
    Pipe pipe;
    pipe.rd.reset();  // writes now fail with EPIPE (SIGPIPE ignored below)
    const auto old = ::signal(SIGPIPE, SIG_IGN);
    SerialDevice dev([](bool) {});
    ConsoleWriter writer(loop, dev, pipe.wr.get());
    guest_print(dev, "lost\n");
    CHECK_NOTHROW(spin(loop, [] { return false; }, 100));  // the write fails in there
    CHECK_NOTHROW(guest_print(dev, "agentvm-init: ready\n"));
    CHECK(dev.ready());
    writer.stop();
    loop.drain();
    writer.finish();
    CHECK(writer.dropped() == 0);  // a console that failed is not a reader falling behind
    ::signal(SIGPIPE, old);
}
