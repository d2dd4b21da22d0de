#include "devices/serial.hpp"

#include <algorithm>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"

namespace agentvm {

namespace {

// IER bits 4-7 are hard-wired to 0 on the 16550.
constexpr uint8_t ier_mask = UART_IER_MSI | UART_IER_RLSI | UART_IER_THRI | UART_IER_RDI;
// MCR bits 5-7 are hard-wired to 0.
constexpr uint8_t mcr_mask = UART_MCR_LOOP | UART_MCR_OUT2 | UART_MCR_OUT1 | UART_MCR_RTS |
                             UART_MCR_DTR;
// IIR bits 6-7 read 1 while the FIFOs are enabled; Linux's probe tells a 16550A by them.
constexpr uint8_t iir_fifo_enabled = 0xc0;
// What an unclaimed ISA read returns.
constexpr uint8_t floating_bus = 0xff;

constexpr std::string_view ready_text = "agentvm-init: ready";
constexpr std::string_view panic_text = "Kernel panic - not syncing";

} // namespace

Serial::Serial(Output output) : output_(std::move(output)) {}

uint8_t Serial::read(uint8_t offset)
{
    switch (offset) {
    case uart::rbr:
        return dlab() ? dll_ : pop_rx();
    case uart::ier:
        return dlab() ? dlm_ : ier_;
    case uart::iir: {
        const uint8_t id = interrupt_id();
        // Datasheet Table IV: reading IIR when it names THRE clears that interrupt.
        if (id == UART_IIR_THRI)
            thr_interrupt_ = false;
        return fifo_enabled_ ? static_cast<uint8_t>(id | iir_fifo_enabled) : id;
    }
    case uart::lcr:
        return lcr_;
    case uart::mcr:
        return mcr_;
    case uart::lsr:
        return line_status();
    case uart::msr:
        return modem_status();
    case uart::scr:
        return scr_;
    default:
        return floating_bus;
    }
}

void Serial::write(uint8_t offset, uint8_t value)
{
    switch (offset) {
    case uart::thr:
        if (dlab())
            dll_ = value;
        else
            transmit(value);
        break;
    case uart::ier: {
        if (dlab()) {
            dlm_ = value;
            break;
        }
        const uint8_t old = ier_;
        ier_ = value & ier_mask;
        // Enabling ETBEI while THR is empty raises THRE at once (what QEMU and Bochs do, and
        // what Linux's startup "THRE reassert" test expects); disabling it drops the source.
        if ((old ^ ier_) & UART_IER_THRI)
            thr_interrupt_ = (ier_ & UART_IER_THRI) != 0;
        break;
    }
    case uart::fcr: {
        const bool enable = (value & UART_FCR_ENABLE_FIFO) != 0;
        // Datasheet, FCR: changing FCR0 empties the FIFOs; CLEAR_XMIT has nothing to clear.
        if (enable != fifo_enabled_ || (value & UART_FCR_CLEAR_RCVR))
            rx_len_ = 0;
        fifo_enabled_ = enable;
        break;
    }
    case uart::lcr:
        lcr_ = value;
        break;
    case uart::mcr:
        mcr_ = value & mcr_mask;
        break;
    case uart::scr:
        scr_ = value;
        break;
    default:
        // LSR writes are for factory testing and MSR is read-only: ignored, as is anything
        // beyond the register file.
        break;
    }
}

bool Serial::receive_enabled() const
{
    return (ier_ & UART_IER_RDI) != 0;
}

bool Serial::enqueue_input(uint8_t byte)
{
    if (loopback())
        return false;
    return push_rx(byte);
}

bool Serial::interrupt_pending() const
{
    return interrupt_id() != UART_IIR_NO_INT;
}

uint8_t Serial::interrupt_id() const
{
    // Highest priority first (datasheet Table IV); line status and modem status are never
    // raised here.
    if ((ier_ & UART_IER_RDI) && rx_len_ > 0)
        return UART_IIR_RDI;
    if ((ier_ & UART_IER_THRI) && thr_interrupt_)
        return UART_IIR_THRI;
    return UART_IIR_NO_INT;
}

void Serial::transmit(uint8_t byte)
{
    if (loopback()) {
        // A byte looped back into a full FIFO is an overrun on real hardware; it is lost
        // either way.
        push_rx(byte);
    } else {
        output_(byte);
    }
    // The byte leaves at once, so THR is empty again and THRE is re-raised.
    thr_interrupt_ = true;
}

bool Serial::push_rx(uint8_t byte)
{
    if (rx_len_ == fifo_capacity)
        return false;
    rx_[(rx_head_ + rx_len_) % fifo_capacity] = byte;
    ++rx_len_;
    return true;
}

uint8_t Serial::pop_rx()
{
    if (rx_len_ == 0)
        return 0;
    const uint8_t byte = rx_[rx_head_];
    rx_head_ = (rx_head_ + 1) % fifo_capacity;
    --rx_len_;
    return byte;
}

uint8_t Serial::line_status() const
{
    // The transmitter is always idle: THR and the shift register are empty.
    uint8_t lsr = UART_LSR_THRE | UART_LSR_TEMT;
    if (rx_len_ > 0)
        lsr |= UART_LSR_DR;
    return lsr;
}

uint8_t Serial::modem_status() const
{
    if (loopback()) {
        // Datasheet, MCR bit 4: in loopback the modem inputs are wired to the MCR outputs.
        uint8_t msr = 0;
        if (mcr_ & UART_MCR_DTR)
            msr |= UART_MSR_DSR;
        if (mcr_ & UART_MCR_RTS)
            msr |= UART_MSR_CTS;
        if (mcr_ & UART_MCR_OUT1)
            msr |= UART_MSR_RI;
        if (mcr_ & UART_MCR_OUT2)
            msr |= UART_MSR_DCD;
        return msr;
    }
    // A null-modem peer that is always there: getty and shells wait for carrier otherwise.
    return UART_MSR_DCD | UART_MSR_DSR | UART_MSR_CTS;
}

Serial::State Serial::save() const
{
    State state;
    state.ier = ier_;
    state.lcr = lcr_;
    state.mcr = mcr_;
    state.scr = scr_;
    state.dll = dll_;
    state.dlm = dlm_;
    state.fifo_enabled = fifo_enabled_;
    state.thr_interrupt = thr_interrupt_;
    state.rx_fifo.reserve(rx_len_);
    for (size_t i = 0; i < rx_len_; ++i)
        state.rx_fifo.push_back(rx_[(rx_head_ + i) % fifo_capacity]);
    return state;
}

void Serial::restore(const State& state)
{
    if (state.rx_fifo.size() > fifo_capacity)
        throw Error(fmt::format("serial state: receive FIFO holds {} bytes, capacity is {}",
                                state.rx_fifo.size(), fifo_capacity));
    if (state.ier & ~ier_mask)
        throw Error(fmt::format("serial state: IER {:#04x} sets reserved bits", state.ier));
    if (state.mcr & ~mcr_mask)
        throw Error(fmt::format("serial state: MCR {:#04x} sets reserved bits", state.mcr));

    ier_ = state.ier;
    lcr_ = state.lcr;
    mcr_ = state.mcr;
    scr_ = state.scr;
    dll_ = state.dll;
    dlm_ = state.dlm;
    fifo_enabled_ = state.fifo_enabled;
    thr_interrupt_ = state.thr_interrupt;
    rx_head_ = 0;
    rx_len_ = state.rx_fifo.size();
    std::copy(state.rx_fifo.begin(), state.rx_fifo.end(), rx_.begin());
}

SerialDevice::SerialDevice(IrqLine irq)
    : irq_(std::move(irq)), serial_([this](uint8_t b) { on_transmit(b); })
{
}

void SerialDevice::set_output_ready(OutputReady ready)
{
    std::lock_guard lock(mutex_);
    output_ready_ = std::move(ready);
}

std::string SerialDevice::take_output(size_t max)
{
    std::lock_guard lock(mutex_);
    output_signalled_ = false;
    return out_.take(max);
}

uint64_t SerialDevice::output_dropped() const
{
    std::lock_guard lock(mutex_);
    return out_.dropped();
}

void SerialDevice::bus_read(uint64_t offset, std::span<uint8_t> data)
{
    std::lock_guard lock(mutex_);
    for (size_t i = 0; i < data.size(); ++i) {
        const uint64_t reg = offset + i;
        data[i] = reg < uart::register_count ? serial_.read(static_cast<uint8_t>(reg))
                                             : floating_bus;
    }
    feed_fifo();
    update_irq();
}

void SerialDevice::bus_write(uint64_t offset, std::span<const uint8_t> data)
{
    OutputReady wake;  // a copy: the writer may detach while this vCPU calls it
    PanicSeen panicked;
    {
        std::lock_guard lock(mutex_);
        for (size_t i = 0; i < data.size(); ++i) {
            const uint64_t reg = offset + i;
            if (reg >= uart::register_count)
                continue;
            serial_.write(static_cast<uint8_t>(reg), data[i]);
            // Anything but another THR byte means the guest paused its output: Linux rewrites
            // IER when the tty runs dry and after each console message. Output goes out then,
            // so a prompt without a newline shows up, yet streaming output wakes the writer
            // once per line.
            if (reg != uart::thr && out_.size() > 0)
                output_waiting();
        }
        feed_fifo();
        update_irq();
        if (std::exchange(wake_due_, false))
            wake = output_ready_;
        if (std::exchange(panic_due_, false))
            panicked = panic_seen_;
    }
    if (wake)
        wake();
    if (panicked)
        panicked();
}

void SerialDevice::set_panic_seen(PanicSeen seen)
{
    std::lock_guard lock(mutex_);
    panic_seen_ = std::move(seen);
}

void SerialDevice::push_input(std::span<const uint8_t> bytes)
{
    std::lock_guard lock(mutex_);
    size_t dropped = 0;
    for (uint8_t byte : bytes) {
        // Once bytes wait on the host side, later ones queue behind them to keep the order;
        // and they wait there until a guest driver listens.
        if (host_queue_.empty() && serial_.receive_enabled() && serial_.enqueue_input(byte))
            continue;
        if (host_queue_.size() < host_queue_capacity)
            host_queue_.push_back(byte);
        else
            ++dropped;
    }
    if (dropped > 0) {
        input_dropped_ += dropped;
        spdlog::warn("serial: guest is not reading its console; dropped {} input bytes ({} in all)",
                     dropped, input_dropped_);
    }
    update_irq();
}

bool SerialDevice::ready() const
{
    std::lock_guard lock(mutex_);
    return ready_at_.has_value();
}

std::optional<std::chrono::steady_clock::time_point> SerialDevice::ready_at() const
{
    std::lock_guard lock(mutex_);
    return ready_at_;
}

std::optional<std::string> SerialDevice::panic_line() const
{
    std::lock_guard lock(mutex_);
    return panic_line_;
}

std::string SerialDevice::panic_context() const
{
    std::lock_guard lock(mutex_);
    return panic_context_;
}

uint64_t SerialDevice::input_dropped() const
{
    std::lock_guard lock(mutex_);
    return input_dropped_;
}

Serial::State SerialDevice::save() const
{
    std::lock_guard lock(mutex_);
    return serial_.save();
}

void SerialDevice::restore(const Serial::State& state)
{
    std::lock_guard lock(mutex_);
    serial_.restore(state);
    feed_fifo();
    irq_level_ = serial_.interrupt_pending();
    irq_(irq_level_);
}

void SerialDevice::on_transmit(uint8_t byte)
{
    if (output_ready_ && out_.push(byte))
        output_waiting(true);  // the writer reports the loss even while its write is stuck
    if (byte == '\n')
        end_line();
    else if (line_.size() < max_line)
        line_.push_back(static_cast<char>(byte));
    if (output_ready_ && (byte == '\n' || out_.size() >= max_line))
        output_waiting();
}

void SerialDevice::end_line()
{
    std::string_view line = line_;
    // The guest tty turns "\n" into "\r\n".
    if (!line.empty() && line.back() == '\r')
        line.remove_suffix(1);
    if (line == ready_text && !ready_at_) {
        ready_at_ = std::chrono::steady_clock::now();
        spdlog::debug("serial: guest is ready");
    }
    if (!panic_line_) {
        if (line.find(panic_text) != std::string_view::npos) {
            panic_line_ = std::string(line);
            panic_due_ = true;
            for (const std::string& before : recent_lines_) {
                panic_context_ += before;
                panic_context_ += '\n';
            }
            if (!panic_context_.empty())
                panic_context_.pop_back();
            recent_lines_.clear();
        } else {
            if (recent_lines_.size() == panic_context_lines)
                recent_lines_.pop_front();
            recent_lines_.emplace_back(line.substr(0, panic_context_width));
        }
    }
    line_.clear();
}

void SerialDevice::output_waiting(bool even_if_signalled)
{
    // One wake-up per batch the writer takes: the vCPU pays for an eventfd write per line at
    // most, not per byte.
    if (output_signalled_ && !even_if_signalled)
        return;
    output_signalled_ = true;
    wake_due_ = true;
}

void SerialDevice::feed_fifo()
{
    while (!host_queue_.empty() && serial_.receive_enabled() &&
           serial_.enqueue_input(host_queue_.front()))
        host_queue_.pop_front();
}

void SerialDevice::update_irq()
{
    const bool level = serial_.interrupt_pending();
    if (level == irq_level_)
        return;
    irq_level_ = level;
    irq_(level);
}

} // namespace agentvm
