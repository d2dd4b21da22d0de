#include <doctest/doctest.h>

#include <array>
#include <cstring>
#include <memory>
#include <vector>

#include "vmm/exit.hpp"
#include "core/layout.hpp"

using namespace agentvm;

namespace {

struct Port : BusDevice {
    std::vector<uint8_t> written;
    uint8_t next_read = 0x5a;
    void bus_read(uint64_t, std::span<uint8_t> data) override
    {
        for (auto& b : data)
            b = next_read++;
    }
    void bus_write(uint64_t, std::span<const uint8_t> data) override
    {
        written.insert(written.end(), data.begin(), data.end());
    }
};

struct RunPage {
    static constexpr size_t size = 4096;
    std::unique_ptr<uint64_t[]> storage = std::make_unique<uint64_t[]>(size / 8);
    kvm_run& run() { return *reinterpret_cast<kvm_run*>(storage.get()); }
    uint8_t* bytes() { return reinterpret_cast<uint8_t*>(storage.get()); }

    // Fills in a port I/O exit whose data sits at data_offset in this page.
    kvm_run& io(uint8_t direction, uint16_t port, uint8_t io_size, uint32_t count, uint64_t data_offset)
    {
        auto& r = run();
        r.exit_reason = KVM_EXIT_IO;
        r.io.direction = direction;
        r.io.size = io_size;
        r.io.port = port;
        r.io.count = count;
        r.io.data_offset = data_offset;
        return r;
    }
};

} // namespace

TEST_CASE("port writes reach the device, rep outs byte by byte")
{
    Bus pio, mmio;
    Port port;
    pio.insert(0x3f8, 8, port);
    RunPage page;
    auto& run = page.io(KVM_EXIT_IO_OUT, 0x3f8, 1, 3, 1024);
    std::memcpy(page.bytes() + 1024, "abc", 3);
    const auto outcome = handle_exit(decode_exit(run, RunPage::size), pio, mmio);
    CHECK(outcome.action == ExitAction::resume);
    CHECK(port.written == std::vector<uint8_t>{'a', 'b', 'c'});
}

TEST_CASE("port reads fill the kvm_run data; unclaimed ports float high")
{
    Bus pio, mmio;
    Port port;
    pio.insert(0x3f8, 8, port);
    RunPage page;
    auto& run = page.io(KVM_EXIT_IO_IN, 0x3fd, 1, 1, 512);
    handle_exit(decode_exit(run, RunPage::size), pio, mmio);
    CHECK(page.bytes()[512] == 0x5a);
    run.io.port = 0x2f8;
    run.io.size = 2;
    handle_exit(decode_exit(run, RunPage::size), pio, mmio);
    CHECK(page.bytes()[512] == 0xff);
    CHECK(page.bytes()[513] == 0xff);
}

TEST_CASE("an I/O exit whose data lies outside the kvm_run page is a failure, not a read")
{
    Bus pio, mmio;
    RunPage page;
    auto& run = page.io(KVM_EXIT_IO_IN, 0, 4, 1000, 1024);
    CHECK(handle_exit(decode_exit(run, RunPage::size), pio, mmio).action == ExitAction::fail);
    run.io.count = 1;
    run.io.data_offset = RunPage::size - 2;
    CHECK(handle_exit(decode_exit(run, RunPage::size), pio, mmio).action == ExitAction::fail);
}

TEST_CASE("i8042 reset and triple fault power the guest off")
{
    Bus pio, mmio;
    RunPage page;
    auto& run = page.io(KVM_EXIT_IO_OUT, layout::i8042_command_port, 1, 1, 256);
    page.bytes()[256] = 0xfe;
    CHECK(handle_exit(decode_exit(run, RunPage::size), pio, mmio).action == ExitAction::power_off);
    page.bytes()[256] = 0x01;  // any other command is not a reset
    CHECK(handle_exit(decode_exit(run, RunPage::size), pio, mmio).action == ExitAction::resume);

    run.exit_reason = KVM_EXIT_SHUTDOWN;
    CHECK(handle_exit(decode_exit(run, RunPage::size), pio, mmio).action == ExitAction::power_off);
}

TEST_CASE("MMIO reads and writes dispatch; unknown exits fail with a reason")
{
    Bus pio, mmio;
    Port dev;
    mmio.insert(0xd0000000, 0x1000, dev);
    RunPage page;
    auto& run = page.run();
    run.exit_reason = KVM_EXIT_MMIO;
    run.mmio.phys_addr = 0xd0000070;
    run.mmio.len = 4;
    run.mmio.is_write = 1;
    std::memcpy(run.mmio.data, "\x01\x02\x03\x04", 4);
    CHECK(handle_exit(decode_exit(run, RunPage::size), pio, mmio).action == ExitAction::resume);
    CHECK(dev.written == std::vector<uint8_t>{1, 2, 3, 4});

    run.mmio.len = 9;
    CHECK(handle_exit(decode_exit(run, RunPage::size), pio, mmio).action == ExitAction::fail);

    run.exit_reason = KVM_EXIT_INTERNAL_ERROR;
    const auto failed = handle_exit(decode_exit(run, RunPage::size), pio, mmio);
    CHECK(failed.action == ExitAction::fail);
    CHECK(failed.why.find("internal error") != std::string::npos);

    run.exit_reason = KVM_EXIT_INTR;
    CHECK(handle_exit(decode_exit(run, RunPage::size), pio, mmio).action == ExitAction::check_stop);
}
