#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <string>
#include <vector>

#include "devices/serial.hpp"
#include "common/error.hpp"
#include "common/fd.hpp"

using namespace agentvm;

namespace {

struct Uart {
    std::vector<uint8_t> out;
    Serial serial{[this](uint8_t b) { out.push_back(b); }};
};

bool data_ready(Serial& s)
{
    return (s.read(uart::lsr) & UART_LSR_DR) != 0;
}

// IIR without the FIFO-enabled bits.
uint8_t iir_id(Serial& s)
{
    return s.read(uart::iir) & (UART_IIR_ID | UART_IIR_NO_INT);
}

void guest_print(SerialDevice& dev, std::string_view text)
{
    for (char c : text) {
        const uint8_t b = static_cast<uint8_t>(c);
        dev.bus_write(uart::thr, {&b, 1});
    }
}

} // namespace

TEST_CASE("serial: reset state")
{
    Uart u;
    CHECK(u.serial.read(uart::ier) == 0);
    CHECK(u.serial.read(uart::iir) == UART_IIR_NO_INT);
    CHECK(u.serial.read(uart::lcr) == 0);
    CHECK(u.serial.read(uart::lsr) == (UART_LSR_THRE | UART_LSR_TEMT));
    CHECK(u.serial.read(uart::msr) == (UART_MSR_DCD | UART_MSR_DSR | UART_MSR_CTS));
    CHECK_FALSE(u.serial.interrupt_pending());
}

TEST_CASE("serial: DLAB switches offsets 0 and 1 to the divisor latch")
{
    Uart u;
    u.serial.write(uart::ier, UART_IER_RDI);
    u.serial.write(uart::lcr, UART_LCR_DLAB | 0x03);
    u.serial.write(uart::dll, 0x01);
    u.serial.write(uart::dlm, 0x02);
    CHECK(u.serial.read(uart::dll) == 0x01);
    CHECK(u.serial.read(uart::dlm) == 0x02);
    CHECK(u.out.empty());  // the DLL write did not transmit

    u.serial.write(uart::lcr, 0x03);
    CHECK(u.serial.read(uart::ier) == UART_IER_RDI);  // IER untouched by the DLM write
    u.serial.write(uart::thr, 'x');
    CHECK(u.out == std::vector<uint8_t>{'x'});

    u.serial.write(uart::lcr, UART_LCR_DLAB);
    CHECK(u.serial.read(uart::dll) == 0x01);  // divisor kept across DLAB toggles
    CHECK(u.serial.read(uart::dlm) == 0x02);
}

TEST_CASE("serial: SCR, LCR, MCR and IER keep what they should")
{
    Uart u;
    u.serial.write(uart::scr, 0xa5);
    CHECK(u.serial.read(uart::scr) == 0xa5);
    u.serial.write(uart::lcr, 0x5b);
    CHECK(u.serial.read(uart::lcr) == 0x5b);
    u.serial.write(uart::ier, 0xff);
    CHECK(u.serial.read(uart::ier) == 0x0f);
    u.serial.write(uart::ier, 0x00);
    CHECK(u.serial.read(uart::ier) == 0x00);
    u.serial.write(uart::mcr, 0xff);
    CHECK(u.serial.read(uart::mcr) == 0x1f);
}

TEST_CASE("serial: LSR and MSR ignore writes; unknown offsets float")
{
    Uart u;
    u.serial.write(uart::lsr, 0x00);
    u.serial.write(uart::msr, 0x00);
    CHECK(u.serial.read(uart::lsr) == (UART_LSR_THRE | UART_LSR_TEMT));
    CHECK(u.serial.read(uart::msr) == (UART_MSR_DCD | UART_MSR_DSR | UART_MSR_CTS));
    CHECK(u.serial.read(8) == 0xff);
    u.serial.write(8, 0x12);
    CHECK(u.out.empty());
}

TEST_CASE("serial: THR writes reach the output in order")
{
    Uart u;
    for (char c : std::string("hi\n"))
        u.serial.write(uart::thr, static_cast<uint8_t>(c));
    CHECK(u.out == std::vector<uint8_t>{'h', 'i', '\n'});
    CHECK(u.serial.read(uart::lsr) == (UART_LSR_THRE | UART_LSR_TEMT));
}

TEST_CASE("serial: receive FIFO, DR and data order")
{
    Uart u;
    CHECK(u.serial.enqueue_input('a'));
    CHECK(u.serial.enqueue_input('b'));
    CHECK(data_ready(u.serial));
    CHECK(u.serial.read(uart::rbr) == 'a');
    CHECK(data_ready(u.serial));
    CHECK(u.serial.read(uart::rbr) == 'b');
    CHECK_FALSE(data_ready(u.serial));
    CHECK(u.serial.read(uart::rbr) == 0);  // empty FIFO reads 0, no underflow
}

TEST_CASE("serial: a full FIFO refuses input instead of growing")
{
    Uart u;
    for (size_t i = 0; i < Serial::fifo_capacity; ++i)
        CHECK(u.serial.enqueue_input(static_cast<uint8_t>(i)));
    CHECK_FALSE(u.serial.enqueue_input(0xee));
    CHECK(u.serial.read(uart::rbr) == 0);
    CHECK(u.serial.enqueue_input(0xee));  // one slot freed
    for (size_t i = 1; i < Serial::fifo_capacity; ++i)
        CHECK(u.serial.read(uart::rbr) == i);
    CHECK(u.serial.read(uart::rbr) == 0xee);  // wrapped around the ring in order
    CHECK_FALSE(data_ready(u.serial));
}

TEST_CASE("serial: FCR clears the receive FIFO and sets the IIR FIFO bits")
{
    Uart u;
    CHECK((u.serial.read(uart::iir) & 0xc0) == 0);
    u.serial.write(uart::fcr, UART_FCR_ENABLE_FIFO);
    CHECK(u.serial.read(uart::iir) == (0xc0 | UART_IIR_NO_INT));
    u.serial.enqueue_input('x');
    u.serial.write(uart::fcr, UART_FCR_ENABLE_FIFO | UART_FCR_CLEAR_RCVR);
    CHECK_FALSE(data_ready(u.serial));
    CHECK((u.serial.read(uart::iir) & 0xc0) == 0xc0);  // FIFO still enabled

    u.serial.enqueue_input('y');
    u.serial.write(uart::fcr, 0);  // disabling the FIFOs empties them too
    CHECK_FALSE(data_ready(u.serial));
    CHECK((u.serial.read(uart::iir) & 0xc0) == 0);
}

TEST_CASE("serial: THRE interrupt is raised by enabling ETBEI and acknowledged by IIR")
{
    Uart u;
    u.serial.write(uart::ier, UART_IER_THRI);
    CHECK(u.serial.interrupt_pending());
    CHECK(u.serial.read(uart::iir) == UART_IIR_THRI);
    CHECK_FALSE(u.serial.interrupt_pending());
    CHECK(u.serial.read(uart::iir) == UART_IIR_NO_INT);

    // A THR write empties at once, so THRE comes back.
    u.serial.write(uart::thr, 'a');
    CHECK(u.serial.interrupt_pending());

    // Linux's startup test: IER 0 then THRI again must re-assert THRE.
    u.serial.write(uart::ier, 0);
    CHECK_FALSE(u.serial.interrupt_pending());
    u.serial.write(uart::ier, UART_IER_THRI);
    CHECK(u.serial.read(uart::iir) == UART_IIR_THRI);
}

TEST_CASE("serial: THRE is not raised while ETBEI is off")
{
    Uart u;
    u.serial.write(uart::thr, 'a');
    CHECK_FALSE(u.serial.interrupt_pending());
    u.serial.write(uart::ier, UART_IER_RDI);
    CHECK_FALSE(u.serial.interrupt_pending());
    CHECK(u.serial.read(uart::iir) == UART_IIR_NO_INT);
}

TEST_CASE("serial: received data outranks THRE in IIR, and reading it does not ack THRE")
{
    Uart u;
    u.serial.write(uart::fcr, UART_FCR_ENABLE_FIFO);
    u.serial.write(uart::ier, UART_IER_RDI | UART_IER_THRI);
    u.serial.enqueue_input('z');
    CHECK(u.serial.read(uart::iir) == (0xc0 | UART_IIR_RDI));
    CHECK(u.serial.read(uart::iir) == (0xc0 | UART_IIR_RDI));  // level: stays until drained
    CHECK(u.serial.read(uart::rbr) == 'z');
    // THRE was shadowed, not acknowledged.
    CHECK(iir_id(u.serial) == UART_IIR_THRI);
    CHECK(iir_id(u.serial) == UART_IIR_NO_INT);
}

TEST_CASE("serial: interrupt level follows receive data and IER")
{
    Uart u;
    u.serial.enqueue_input('a');
    CHECK_FALSE(u.serial.interrupt_pending());  // ERBFI off
    u.serial.write(uart::ier, UART_IER_RDI);
    CHECK(u.serial.interrupt_pending());
    u.serial.write(uart::ier, 0);
    CHECK_FALSE(u.serial.interrupt_pending());
    u.serial.write(uart::ier, UART_IER_RDI);
    CHECK(u.serial.interrupt_pending());
    u.serial.read(uart::rbr);
    CHECK_FALSE(u.serial.interrupt_pending());
}

TEST_CASE("serial: loopback echoes THR into RBR and wires MCR to MSR")
{
    Uart u;
    // Linux autoconfig: MCR = LOOP | OUT2 | RTS must read back DCD | CTS.
    u.serial.write(uart::mcr, UART_MCR_LOOP | UART_MCR_OUT2 | UART_MCR_RTS);
    CHECK((u.serial.read(uart::msr) & 0xf0) == (UART_MSR_DCD | UART_MSR_CTS));
    u.serial.write(uart::mcr, UART_MCR_LOOP | UART_MCR_DTR | UART_MCR_OUT1);
    CHECK((u.serial.read(uart::msr) & 0xf0) == (UART_MSR_DSR | UART_MSR_RI));

    u.serial.write(uart::thr, 0x5a);
    CHECK(u.out.empty());
    CHECK(data_ready(u.serial));
    CHECK(u.serial.read(uart::rbr) == 0x5a);
    // The receiver is cut off from the line while looped back.
    CHECK_FALSE(u.serial.enqueue_input('h'));

    u.serial.write(uart::mcr, 0);
    CHECK(u.serial.enqueue_input('h'));
    u.serial.write(uart::thr, 'o');
    CHECK(u.out == std::vector<uint8_t>{'o'});
}

TEST_CASE("serial: Linux 16550A probe sees a 16550A")
{
    Uart u;
    // The IER test of autoconfig().
    u.serial.write(uart::ier, 0);
    CHECK((u.serial.read(uart::ier) & 0x0f) == 0);
    u.serial.write(uart::ier, 0x0f);
    CHECK((u.serial.read(uart::ier) & 0x0f) == 0x0f);
    u.serial.write(uart::ier, 0);
    // EFR probe at LCR 0xbf must not find an EFR (IIR never reads 0 with the FIFO on).
    u.serial.write(uart::lcr, 0xbf);
    u.serial.write(uart::fcr, 0);
    u.serial.write(uart::lcr, 0);
    u.serial.write(uart::fcr, UART_FCR_ENABLE_FIFO);
    CHECK((u.serial.read(uart::iir) >> 6) == 3);
    u.serial.write(uart::lcr, UART_LCR_DLAB);
    CHECK(u.serial.read(uart::iir) != 0);
}

TEST_CASE("serial: save, restore, save is identical")
{
    Uart a;
    a.serial.write(uart::lcr, UART_LCR_DLAB);
    a.serial.write(uart::dll, 1);
    a.serial.write(uart::dlm, 0);
    a.serial.write(uart::lcr, 0x03);
    a.serial.write(uart::fcr, UART_FCR_ENABLE_FIFO);
    a.serial.write(uart::mcr, UART_MCR_OUT2 | UART_MCR_RTS | UART_MCR_DTR);
    a.serial.write(uart::scr, 0x42);
    a.serial.write(uart::ier, UART_IER_RDI | UART_IER_THRI);
    // Move the ring head off 0 so the restore must re-linearise it.
    for (uint8_t b : {'p', 'q', 'r', 's'})
        a.serial.enqueue_input(b);
    a.serial.read(uart::rbr);
    a.serial.read(uart::rbr);

    const Serial::State saved = a.serial.save();
    CHECK(saved.rx_fifo == std::vector<uint8_t>{'r', 's'});
    CHECK(saved.thr_interrupt);

    Uart b;
    b.serial.restore(saved);
    CHECK(b.serial.save() == saved);
    CHECK(b.serial.interrupt_pending() == a.serial.interrupt_pending());
    // Behaviour continues where it left off.
    CHECK(b.serial.read(uart::rbr) == 'r');
    CHECK(b.serial.read(uart::rbr) == 's');
    CHECK(iir_id(b.serial) == UART_IIR_THRI);
}

TEST_CASE("serial: restore rejects state save() could not produce")
{
    Uart u;
    u.serial.write(uart::scr, 0x11);
    const Serial::State before = u.serial.save();

    Serial::State too_long;
    too_long.rx_fifo.assign(Serial::fifo_capacity + 1, 'x');
    CHECK_THROWS_AS(u.serial.restore(too_long), Error);

    Serial::State bad_ier;
    bad_ier.ier = 0x10;
    CHECK_THROWS_AS(u.serial.restore(bad_ier), Error);

    Serial::State bad_mcr;
    bad_mcr.mcr = 0x20;
    CHECK_THROWS_AS(u.serial.restore(bad_mcr), Error);

    CHECK(u.serial.save() == before);  // a rejected restore changes nothing

    Serial::State full;
    full.rx_fifo.assign(Serial::fifo_capacity, 'x');
    CHECK_NOTHROW(u.serial.restore(full));
    CHECK_FALSE(u.serial.enqueue_input('y'));
}

TEST_CASE("serial device: console output is kept for the writer; panic and ready lines are seen")
{
    std::vector<bool> levels;
    SerialDevice dev([&](bool level) { levels.push_back(level); });
    int wakes = 0;
    dev.set_output_ready([&] { ++wakes; });
    CHECK_FALSE(dev.ready());
    CHECK_FALSE(dev.panic_line());

    guest_print(dev, "[    0.100000] booting\r\n");
    CHECK(wakes == 1);
    guest_print(dev, "agentvm-init: ready-ish\r\n");
    CHECK(wakes == 1);  // the writer has not taken the first line yet: no second wake-up
    CHECK_FALSE(dev.ready());
    guest_print(dev, "agentvm-init: ready\r\n");
    CHECK(dev.ready());
    CHECK(dev.ready_at().has_value());

    guest_print(dev, "[    1.5] Kernel panic - not syncing: VFS: Unable to mount root fs\r\n");
    guest_print(dev, "[    1.6] Kernel panic - not syncing: second\r\n");
    REQUIRE(dev.panic_line());
    CHECK(*dev.panic_line() ==
          "[    1.5] Kernel panic - not syncing: VFS: Unable to mount root fs");
    CHECK(dev.panic_context() ==
          "[    0.100000] booting\nagentvm-init: ready-ish\nagentvm-init: ready");

    guest_print(dev, "$ ");  // a prompt, no newline yet
    CHECK(levels.empty());   // IER was never enabled
    CHECK(dev.take_output(10) == "[    0.100");
    CHECK(dev.take_output(SerialDevice::output_capacity) ==
          "000] booting\r\nagentvm-init: ready-ish\r\nagentvm-init: ready\r\n"
          "[    1.5] Kernel panic - not syncing: VFS: Unable to mount root fs\r\n"
          "[    1.6] Kernel panic - not syncing: second\r\n$ ");
    guest_print(dev, "next\n");
    CHECK(wakes == 2);  // taken, so the next line wakes the writer again
    CHECK(dev.output_dropped() == 0);
}

TEST_CASE("serial device: the lines before a panic are kept, bounded in number and width")
{
    SerialDevice dev([](bool) {});
    CHECK(dev.panic_context().empty());
    for (size_t i = 0; i < SerialDevice::panic_context_lines + 10; ++i)
        guest_print(dev, "line " + std::to_string(i) + "\n");
    guest_print(dev, "RIP: " + std::string(2 * SerialDevice::panic_context_width, 'r') + "\n");
    guest_print(dev, "Kernel panic - not syncing: Fatal exception in interrupt\n");
    guest_print(dev, "after\n");
    const std::string context = dev.panic_context();
    CHECK(context.find("line 10\n") == std::string::npos);  // the oldest fell out
    CHECK(context.rfind("line 11\n", 0) == 0);
    CHECK(context.ends_with("\nRIP: " + std::string(SerialDevice::panic_context_width - 5, 'r')));
    CHECK(std::count(context.begin(), context.end(), '\n') ==
          static_cast<long>(SerialDevice::panic_context_lines - 1));
    CHECK(context.find("after") == std::string::npos);
}

TEST_CASE("serial device: the panic line is reported once, when it is complete, with the lock free")
{
    SerialDevice dev([](bool) {});
    int seen = 0;
    std::string line_then;
    // The handler reads the device back, as the VM's does: it must run without the lock.
    dev.set_panic_seen([&] {
        ++seen;
        line_then = dev.panic_line().value_or("");
    });
    guest_print(dev, "Kernel panic - not syncing");
    CHECK(seen == 0);  // not a line yet
    guest_print(dev, ": Attempted to kill init!\n");
    CHECK(seen == 1);
    CHECK(line_then == "Kernel panic - not syncing: Attempted to kill init!");
    guest_print(dev, "Kernel panic - not syncing: again\nKernel Offset: disabled\n");
    CHECK(seen == 1);
}

TEST_CASE("serial device: without a writer, output is matched but not kept")
{
    SerialDevice dev([](bool) {});
    guest_print(dev, "agentvm-init: ready\n");
    CHECK(dev.ready());
    CHECK(dev.take_output(SerialDevice::output_capacity).empty());
    CHECK(dev.output_dropped() == 0);
}

TEST_CASE("serial device: a partial line wakes the writer when the guest stops transmitting")
{
    SerialDevice dev([](bool) {});
    int wakes = 0;
    dev.set_output_ready([&] { ++wakes; });
    guest_print(dev, "$ ");
    CHECK(wakes == 0);  // held back, waiting for more
    const uint8_t ier = 0;
    dev.bus_write(uart::ier, {&ier, 1});  // Linux's stop_tx
    CHECK(wakes == 1);
    CHECK(dev.take_output(16) == "$ ");
}

TEST_CASE("serial device: a console line longer than the tracking cap is output whole")
{
    const std::string long_line(3 * SerialDevice::max_line, 'a');
    SerialDevice dev([](bool) {});
    int wakes = 0;
    dev.set_output_ready([&] { ++wakes; });
    guest_print(dev, long_line + "Kernel panic - not syncing\n");
    CHECK(wakes == 1);  // a line's worth piled up: the writer need not wait for its end
    CHECK_FALSE(dev.panic_line());  // cut off from matching, but not from output
    guest_print(dev, "agentvm-init: ready\n");
    CHECK(dev.ready());
    CHECK(dev.take_output(SerialDevice::output_capacity) ==
          long_line + "Kernel panic - not syncing\nagentvm-init: ready\n");
}

TEST_CASE("serial device: output beyond the bound is dropped and counted, with one wake-up per burst")
{
    SerialDevice dev([](bool) {});
    int wakes = 0;
    dev.set_output_ready([&] { ++wakes; });
    guest_print(dev, std::string(SerialDevice::output_capacity + 1000, 'x'));
    CHECK(dev.output_dropped() == 1000);
    // One for a line's worth piling up, one as the loss began; none for each byte lost.
    CHECK(wakes == 2);
    // The loss is reported even though the writer took nothing since its first wake-up.
    guest_print(dev, std::string(10, 'y'));
    CHECK(wakes == 2);
    CHECK(dev.output_dropped() == 1010);
    CHECK(dev.take_output(SerialDevice::output_capacity) == std::string(SerialDevice::output_capacity, 'x'));
    guest_print(dev, std::string(SerialDevice::output_capacity + 1, 'z'));
    CHECK(wakes == 4);  // a line's worth, and a new burst of loss
    CHECK(dev.output_dropped() == 1011);
}

TEST_CASE("serial device: interrupt line and host input beyond the FIFO")
{
    std::vector<bool> levels;
    SerialDevice dev([&](bool level) { levels.push_back(level); });
    const uint8_t rdi = UART_IER_RDI;
    dev.bus_write(uart::ier, {&rdi, 1});
    CHECK(levels.empty());

    std::vector<uint8_t> input(Serial::fifo_capacity + 100);
    for (size_t i = 0; i < input.size(); ++i)
        input[i] = static_cast<uint8_t>(i);
    dev.push_input(input);
    CHECK(levels == std::vector<bool>{true});

    // The guest drains everything, in order; the host queue refills the FIFO behind it.
    std::vector<uint8_t> got;
    for (;;) {
        uint8_t lsr = 0;
        dev.bus_read(uart::lsr, {&lsr, 1});
        if (!(lsr & UART_LSR_DR))
            break;
        uint8_t b = 0;
        dev.bus_read(uart::rbr, {&b, 1});
        got.push_back(b);
    }
    CHECK(got == input);
    CHECK(levels == std::vector<bool>{true, false});
    CHECK(dev.input_dropped() == 0);

    // More than FIFO + host queue: the excess is dropped and counted, not stored.
    std::vector<uint8_t> flood(Serial::fifo_capacity + SerialDevice::host_queue_capacity + 10, 'f');
    dev.push_input(flood);
    CHECK(dev.input_dropped() == 10);
}

TEST_CASE("serial device: host input waits until a guest driver listens, surviving its FIFO reset")
{
    std::vector<bool> levels;
    SerialDevice dev([&](bool level) { levels.push_back(level); });
    const uint8_t typed[] = {'l', 's', '\n'};
    dev.push_input(typed);  // typed while the kernel is still booting
    uint8_t lsr = 0;
    dev.bus_read(uart::lsr, {&lsr, 1});
    CHECK((lsr & UART_LSR_DR) == 0);
    CHECK(levels.empty());

    // The 8250 driver's start-up: clear the FIFOs, then enable the receive interrupt.
    const uint8_t clear = UART_FCR_ENABLE_FIFO | UART_FCR_CLEAR_RCVR | UART_FCR_CLEAR_XMIT;
    dev.bus_write(uart::fcr, {&clear, 1});
    const uint8_t rdi = UART_IER_RDI;
    dev.bus_write(uart::ier, {&rdi, 1});
    CHECK(levels == std::vector<bool>{true});
    std::string got;
    for (;;) {
        dev.bus_read(uart::lsr, {&lsr, 1});
        if (!(lsr & UART_LSR_DR))
            break;
        uint8_t b = 0;
        dev.bus_read(uart::rbr, {&b, 1});
        got += static_cast<char>(b);
    }
    CHECK(got == "ls\n");
    CHECK(dev.input_dropped() == 0);
}

TEST_CASE("serial device: THRE interrupt edges for the Linux transmit path")
{
    std::vector<bool> levels;
    SerialDevice dev([&](bool level) { levels.push_back(level); });
    const uint8_t thri = UART_IER_THRI;
    dev.bus_write(uart::ier, {&thri, 1});  // start_tx
    CHECK(levels == std::vector<bool>{true});
    uint8_t iir = 0;
    dev.bus_read(uart::iir, {&iir, 1});
    CHECK((iir & UART_IIR_ID) == UART_IIR_THRI);
    CHECK(levels == std::vector<bool>{true, false});
    guest_print(dev, "x");  // the handler refills THR: THRE again, a new edge
    CHECK(levels == std::vector<bool>{true, false, true});
    const uint8_t off = 0;
    dev.bus_write(uart::ier, {&off, 1});  // stop_tx
    CHECK(levels == std::vector<bool>{true, false, true, false});
}

TEST_CASE("serial device: save and restore go through the adapter and re-drive the IRQ")
{
    std::vector<bool> levels;
    SerialDevice a([](bool) {});
    const uint8_t rdi = UART_IER_RDI;
    a.bus_write(uart::ier, {&rdi, 1});
    const uint8_t in[] = {'k'};
    a.push_input(in);
    const Serial::State saved = a.save();

    SerialDevice b([&](bool level) { levels.push_back(level); });
    b.restore(saved);
    CHECK(levels == std::vector<bool>{true});
    CHECK(b.save() == saved);
    uint8_t byte = 0;
    b.bus_read(uart::rbr, {&byte, 1});
    CHECK(byte == 'k');
    CHECK(levels == std::vector<bool>{true, false});

    Serial::State bad;
    bad.rx_fifo.assign(Serial::fifo_capacity + 1, 0);
    CHECK_THROWS_AS(b.restore(bad), Error);
}
