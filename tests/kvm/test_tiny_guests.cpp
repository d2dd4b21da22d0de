// kvm tier: tiny freestanding guests on the real /dev/kvm, driving the real vCPU loop, exit
// dispatch, 8250 UART and virtio-mmio block device. They avoid interrupts and exceptions so
// they also run on PVM hosts.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "tests/kvm/tiny_guest.hpp"
#include "tests/support/disk_image.hpp"
#include "vmm/kvm.hpp"
#include "core/layout.hpp"

using namespace agentvm;
using namespace agentvm::test;

namespace {

class TestMmio : public BusDevice {
public:
    void bus_read(uint64_t offset, std::span<uint8_t> data) override
    {
        std::lock_guard lock(mutex_);
        uint8_t regs[16] = {};
        const uint32_t id = 0xfeedc0de;
        std::memcpy(regs, &id, 4);
        std::memcpy(regs + 4, &value_, 4);
        regs[9] = 0x42;
        for (size_t i = 0; i < data.size(); ++i)
            data[i] = offset + i < sizeof(regs) ? regs[offset + i] : 0;
    }
    void bus_write(uint64_t offset, std::span<const uint8_t> data) override
    {
        std::lock_guard lock(mutex_);
        if (offset == 4 && data.size() == 4)
            std::memcpy(&value_, data.data(), 4);
    }

private:
    std::mutex mutex_;
    uint32_t value_ = 0;
};

VmResult run_guest(Vm& vm, ResultPorts& ports)
{
    vm.pio_bus().insert(0x500, 8, ports);
    return vm.run();
}

} // namespace

TEST_CASE("the vCPU loop runs a guest to its i8042 power-off and UART output reaches the console")
{
    Kvm kvm;
    ConsoleCapture console;
    Vm vm(kvm, tiny_config("serial_hello.elf", console.fd()));
    ResultPorts ports;
    const VmResult result = run_guest(vm, ports);
    CHECK(result.outcome == VmOutcome::powered_off);
    REQUIRE(ports.result().has_value());
    CHECK(*ports.result() == 0);
    CHECK(console.text() == "hello from a tiny guest\n");
}

TEST_CASE("MMIO exits dispatch to the device at the address; unclaimed reads float high")
{
    Kvm kvm;
    ConsoleCapture console;
    Vm vm(kvm, tiny_config("mmio_probe.elf", console.fd()));
    TestMmio device;
    vm.mmio_bus().insert(0xd0800000, 0x1000, device);
    ResultPorts ports;
    const VmResult result = run_guest(vm, ports);
    CHECK(result.outcome == VmOutcome::powered_off);
    CHECK(ports.trace() == std::vector<uint32_t>{0xfeedc0de, 0x12345678, 0x42, 0xffffffff});
}

TEST_CASE("vCPU registers set through KVM are the ones the guest runs with")
{
    Kvm kvm;
    ConsoleCapture console;
    Vm vm(kvm, tiny_config("counter.elf", console.fd()));
    auto regs = vm.vcpu(0).regs();
    regs.rbx = 1000;
    vm.vcpu(0).set_regs(regs);
    const auto read_back = vm.vcpu(0).regs();
    CHECK(read_back.rbx == 1000);
    CHECK(read_back.rip == regs.rip);
    auto sregs = vm.vcpu(0).sregs();
    CHECK(sregs.cs.l == 1);
    CHECK(sregs.cr3 == layout::pml4);
    vm.vcpu(0).set_sregs(sregs);
    ResultPorts ports;
    const VmResult result = run_guest(vm, ports);
    CHECK(result.outcome == VmOutcome::powered_off);
    REQUIRE(ports.result().has_value());
    CHECK(*ports.result() == 1100);
}

TEST_CASE("a polled guest driver reads and writes through virtio-mmio and virtio-blk")
{
    // Base image: sector 0 starts with a marker, 64 KiB in all. The directory removes itself
    // however the test ends.
    const TempDir dir;
    const std::string path = dir.path + "/disk.img";
    std::vector<uint8_t> image(64 * 1024, 0);
    std::memcpy(image.data(), "AVM!", 4);
    write_bytes(path, image);

    {
        Kvm kvm;
        ConsoleCapture console;
        VmConfig config = tiny_config("virtio_blk_poll.elf", console.fd());
        config.rootfs_path = path;
        Vm vm(kvm, config);
        ResultPorts ports;
        const VmResult result = run_guest(vm, ports);
        CHECK(result.outcome == VmOutcome::powered_off);
        REQUIRE(ports.result().has_value());
        CHECK(*ports.result() == 0);
        uint32_t marker;
        std::memcpy(&marker, "AVM!", 4);
        CHECK(ports.trace() == std::vector<uint32_t>{1, 2, 128, 3, marker, 4, 5});
    }

    // The guest's write went to the overlay: the base image is byte-for-byte unchanged.
    CHECK(read_bytes(path) == image);
}

TEST_CASE("a kernel file that is not a kernel is refused before any guest runs")
{
    Kvm kvm;
    ConsoleCapture console;
    VmConfig config = tiny_config("serial_hello.elf", console.fd());
    config.kernel_path = "/etc/hostname";
    CHECK_THROWS_AS(Vm(kvm, config), Error);
    config.kernel_path = "/nonexistent/vmlinux";
    CHECK_THROWS_WITH_AS(Vm(kvm, config), doctest::Contains("/nonexistent/vmlinux"), Error);
}
