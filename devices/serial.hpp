// A 16550A UART on COM1, as Linux's 8250 driver (probe, console and tty) and its early
// console drive it.
//
// Follows the National Semiconductor PC16550D datasheet: its register descriptions, Table II
// (register summary) and Table IV (interrupt control functions), with the constants from
// <linux/serial_reg.h>.
// Emulated: the register file with the DLAB-switched divisor latch, a bounded receive FIFO,
// interrupt identification by priority (received data above transmitter empty), the 16550
// rule that reading IIR or writing THR acknowledges the THRE interrupt, and loopback
// (MCR bit 4) as far as the kernel's autoconfig probe looks at it.
// Left out: line timing (the divisor is kept but bytes leave at once, so THR is always empty
// and there is no transmit FIFO), receiver line-status errors, modem-status interrupts and
// delta bits, FIFO trigger levels and the character-timeout interrupt (received data is
// signalled as soon as the FIFO holds a byte), DMA modes, and OUT2 gating of the IRQ line.
#pragma once

#include <linux/serial_reg.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/bus.hpp"
#include "devices/console_buffer.hpp"

namespace agentvm {

// Register offsets from the port base. Several share an offset: reads and writes see
// different registers (RBR/THR, IIR/FCR), and LCR.DLAB swaps offsets 0 and 1 for the divisor.
namespace uart {
inline constexpr uint8_t rbr = UART_RX;   // read, DLAB=0
inline constexpr uint8_t thr = UART_TX;   // write, DLAB=0
inline constexpr uint8_t dll = UART_DLL;  // DLAB=1
inline constexpr uint8_t ier = UART_IER;  // DLAB=0
inline constexpr uint8_t dlm = UART_DLM;  // DLAB=1
inline constexpr uint8_t iir = UART_IIR;  // read
inline constexpr uint8_t fcr = UART_FCR;  // write
inline constexpr uint8_t lcr = UART_LCR;
inline constexpr uint8_t mcr = UART_MCR;
inline constexpr uint8_t lsr = UART_LSR;
inline constexpr uint8_t msr = UART_MSR;
inline constexpr uint8_t scr = UART_SCR;
inline constexpr uint8_t register_count = 8;
} // namespace uart

// The UART state machine: no fds, no locks, driven by register offsets.
class Serial {
public:
    static constexpr size_t fifo_capacity = 64;
    // Receives every byte the guest transmits (not those it loops back to itself).
    using Output = std::function<void(uint8_t)>;

    struct State {
        uint8_t ier = 0;
        uint8_t lcr = 0;
        uint8_t mcr = 0;
        uint8_t scr = 0;
        uint8_t dll = 0;
        uint8_t dlm = 0;
        bool fifo_enabled = false;
        bool thr_interrupt = false;   // THRE interrupt raised and not yet acknowledged
        std::vector<uint8_t> rx_fifo; // oldest first, at most fifo_capacity
        bool operator==(const State&) const = default;
    };

    explicit Serial(Output output);

    // offset < uart::register_count; other offsets read as 0xff and ignore writes.
    uint8_t read(uint8_t offset);
    void write(uint8_t offset, uint8_t value);

    // Puts a byte from the host on the receive line. False, and the byte is not taken, when
    // the FIFO is full or the UART is in loopback (its receiver is then cut off from the line).
    bool enqueue_input(uint8_t byte);

    // The level of the UART's interrupt output.
    bool interrupt_pending() const;
    // The guest driver listens for input (IER receive interrupt on): before that, bytes a
    // host types would be lost to the driver's FIFO reset at start-up.
    bool receive_enabled() const;

    State save() const;
    // Throws Error if state could not have come from save(); leaves *this unchanged then.
    void restore(const State& state);

private:
    uint8_t interrupt_id() const;
    void transmit(uint8_t byte);
    bool push_rx(uint8_t byte);
    uint8_t pop_rx();
    uint8_t line_status() const;
    uint8_t modem_status() const;
    bool dlab() const { return (lcr_ & UART_LCR_DLAB) != 0; }
    bool loopback() const { return (mcr_ & UART_MCR_LOOP) != 0; }

    Output output_;
    uint8_t ier_ = 0;
    uint8_t lcr_ = 0;
    uint8_t mcr_ = 0;
    uint8_t scr_ = 0;
    // 115200 / 12 = 9600 baud, what PC firmware leaves behind; the guest reprograms it.
    uint8_t dll_ = 12;
    uint8_t dlm_ = 0;
    bool fifo_enabled_ = false;
    bool thr_interrupt_ = false;
    std::array<uint8_t, fifo_capacity> rx_{};  // ring buffer
    size_t rx_head_ = 0;
    size_t rx_len_ = 0;
};

// Ties a Serial to the port-I/O bus, host input, the IRQ line and a bounded buffer of console
// output that the I/O loop writes out (devices/console_writer.hpp): no fd here, so a vCPU never
// waits on whoever reads the console. vCPU threads (bus_read/bus_write) and the I/O thread
// (push_input, take_output) share it; one mutex guards everything.
class SerialDevice : public BusDevice {
public:
    // Called with the new level whenever the UART's interrupt output changes, with the
    // device lock held (so levels arrive in order): it must not call back into the device.
    using IrqLine = std::function<void(bool level)>;
    // Called without the device lock, from the transmitting vCPU: output is waiting to be
    // taken. It must not block.
    using OutputReady = std::function<void()>;
    // Called once, without the device lock, from the vCPU that completed the guest's panic
    // line: the kernel is done for, whether or not it goes on to reboot.
    using PanicSeen = std::function<void()>;

    // Host bytes the FIFO cannot take yet wait here; beyond this they are dropped.
    static constexpr size_t host_queue_capacity = 16 * 1024;
    // Console output not yet taken is held up to this; beyond it, bytes are dropped and counted.
    static constexpr size_t output_capacity = 64 * 1024;
    // Console lines longer than this are cut for readiness/panic matching (not for output).
    static constexpr size_t max_line = 4096;
    // The console lines kept to say why the kernel panicked (an oops with its registers and
    // backtrace is ~50 lines), each cut at panic_context_width.
    static constexpr size_t panic_context_lines = 64;
    static constexpr size_t panic_context_width = 160;

    explicit SerialDevice(IrqLine irq);
    SerialDevice(const SerialDevice&) = delete;
    SerialDevice& operator=(const SerialDevice&) = delete;

    // Until this is called the guest's console output is discarded (still matched for the
    // ready and panic lines). From then on it is kept for take_output(), and `ready` is called
    // at the end of a line, when the guest pauses its output, when a line's worth piles up,
    // and when output begins to be dropped. nullptr stops keeping output again.
    void set_output_ready(OutputReady ready);
    // Set before the vCPUs run.
    void set_panic_seen(PanicSeen seen);
    // Removes and returns up to max bytes of console output, oldest first.
    std::string take_output(size_t max);
    // Console output bytes dropped because the buffer was full.
    uint64_t output_dropped() const;

    void bus_read(uint64_t offset, std::span<uint8_t> data) override;
    void bus_write(uint64_t offset, std::span<const uint8_t> data) override;

    // Bytes typed on the host, for the guest to receive in order.
    void push_input(std::span<const uint8_t> bytes);

    // True once the guest printed the line "agentvm-init: ready".
    bool ready() const;
    std::optional<std::chrono::steady_clock::time_point> ready_at() const;
    // The first console line containing "Kernel panic - not syncing", if any.
    std::optional<std::string> panic_line() const;
    // The console lines printed before that panic line (up to panic_context_lines, oldest
    // first, joined by "\n"): the oops that led to it. Empty when there is no panic.
    std::string panic_context() const;
    // Host input bytes dropped because the guest did not read them fast enough.
    uint64_t input_dropped() const;

    // Guest-visible UART state; host-side queues are not part of it.
    Serial::State save() const;
    // Throws Error on invalid state; re-drives the IRQ line to the restored level.
    void restore(const Serial::State& state);

private:
    void on_transmit(uint8_t byte);
    void end_line();
    void output_waiting(bool even_if_signalled = false);
    void feed_fifo();
    void update_irq();

    mutable std::mutex mutex_;
    IrqLine irq_;
    bool irq_level_ = false;
    OutputReady output_ready_;
    ConsoleBuffer out_{output_capacity};
    bool output_signalled_ = false;  // output_ready_ was called and nothing was taken since
    bool wake_due_ = false;          // call output_ready_ once the lock is released
    PanicSeen panic_seen_;
    bool panic_due_ = false;  // call panic_seen_ once the lock is released
    std::string line_; // the current line, cut at max_line
    std::optional<std::chrono::steady_clock::time_point> ready_at_;
    std::optional<std::string> panic_line_;
    std::deque<std::string> recent_lines_;  // until the panic: the last panic_context_lines
    std::string panic_context_;
    std::deque<uint8_t> host_queue_;
    uint64_t input_dropped_ = 0;
    Serial serial_;
};

} // namespace agentvm
