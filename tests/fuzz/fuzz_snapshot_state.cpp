// Fuzzes a snapshot's state.cbor as Vm::restore_state reads it: decode_cbor, then every
// State parser on its place in the document (vCPU and VM KVM state, vmm/kvm_state_json.hpp;
// serial, virtio-blk and virtio-vsock devices and their transports, devices/state_json.hpp),
// then, as restore_state does, each accepted state restored into a fresh device, each device
// before its transport, followed by the transport reset the VMM sends and a notify of every
// queue. The input is the file's bytes.
//
// Error is the documented refusal of decode_cbor, the parsers and the restore()s; anything
// else is a finding, and so is a state that does not survive to_json -> parse unchanged.
// load_snapshot's manifest checks are left out: they need a Kvm (an open /dev/kvm, to read the
// host CPU's features) and the kernel and rootfs files; manifest.json is plain JSON read with
// nlohmann's checked accessors, its content digests cover state.cbor, and state.cbor is what
// is fuzzed here.
#include <linux/virtio_config.h>
#include <linux/virtio_mmio.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "devices/cow_disk.hpp"
#include "devices/serial.hpp"
#include "devices/state_json.hpp"
#include "devices/virtio_blk.hpp"
#include "devices/virtio_mmio.hpp"
#include "devices/virtio_vsock.hpp"
#include "tests/fuzz/fuzz_support.hpp"
#include "tests/support/mmio_driver.hpp"
#include "common/error.hpp"
#include "core/event_loop.hpp"
#include "common/fd.hpp"
#include "core/guest_memory.hpp"
#include "vmm/kvm_state_json.hpp"
#include "vmm/warm_pages.hpp"

using namespace agentvm;
using namespace agentvm::fuzz;
using agentvm::test::MmioDriver;
using nlohmann::json;

namespace {

constexpr uint64_t ram_bytes = 16 * 4096;
constexpr uint64_t disk_sectors = 64;

const GuestMemory& memory()
{
    static const GuestMemory mem(ram_bytes);
    return mem;
}

EventLoop& loop()
{
    static EventLoop l;
    return l;
}

// The base image of every virtio-blk this target builds, unlinked from birth.
Fd base_image()
{
    static const int fd = [] {
        const int memfd = ::memfd_create("fuzz-snapshot-base", MFD_CLOEXEC);
        check(memfd >= 0 && ::ftruncate(memfd, disk_sectors * CowDisk::sector_size) == 0, "base image");
        return memfd;
    }();
    return Fd(::dup(fd));
}

struct NullBackend : VsockBackend {
    bool on_connect_request(VsockConnId) override { return false; }
    void on_connected(VsockConnId) override {}
    size_t on_data(VsockConnId, std::span<const uint8_t> data) override { return data.size(); }
    void on_shutdown(VsockConnId, uint32_t) override {}
    void on_closed(VsockConnId) override {}
    void on_reset(std::span<const VsockConnId>) override {}
};

const json* member(const json& j, const char* name)
{
    if (!j.is_object())
        return nullptr;
    const auto it = j.find(name);
    return it == j.end() ? nullptr : &*it;
}

// parse(j), refused with Error or accepted; an accepted state must come back unchanged from
// its own JSON.
template <typename State>
std::optional<State> parse_state(const json* j, const char* path)
{
    if (!j)
        return std::nullopt;
    State s;
    try {
        s = state_from_json<State>(*j, path);
    } catch (const Error&) {
        return std::nullopt;
    }
    try {
        check(state_from_json<State>(json(s), path) == s, "state -> JSON -> state differs");
    } catch (const Error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        finding("the parser refused the JSON of a state it had accepted");
    }
    return s;
}

// The KVM parsers have no operator== on their states: compare their JSON instead.
template <typename State>
void parse_kvm_state(const json& j, State (*from)(const json&), json (*to)(const State&))
{
    State s;
    try {
        s = from(j);
    } catch (const Error&) {
        return;
    }
    const json once = to(s);
    try {
        check(to(from(once)) == once, "KVM state -> JSON -> state differs");
    } catch (const Error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        finding("the KVM state parser refused the JSON of a state it had accepted");
    }
}

template <typename Device>
void restore_transport(const json& doc, const char* path, Device& device)
{
    const auto state = parse_state<VirtioMmioTransport::State>(member(doc, "transport"), path);
    if (!state)
        return;
    VirtioMmioTransport mmio(memory(), device, [] {}, [](uint16_t) {});
    try {
        mmio.restore(*state);
    } catch (const Error&) {
        return;
    }
    check(mmio.save() == *state, "transport restore -> save differs");
    if constexpr (std::is_same_v<Device, VirtioVsock>)
        device.send_transport_reset();
    for (size_t q = 0; q < device.queue_count(); ++q)
        mmio.notify_queue(static_cast<uint16_t>(q));
    loop().drain();
    MmioDriver(mmio).wr(VIRTIO_MMIO_STATUS, 0);
    loop().drain();
}

// Runs of pages inside a 64 MiB guest, refused with Error or accepted and written back as read.
void parse_warm_pages(const json* j)
{
    if (!j)
        return;
    constexpr uint64_t ram_pages = 64 * 256;
    std::vector<PageRun> runs;
    try {
        runs = page_runs_from_json(*j, ram_pages);
    } catch (const Error&) {
        return;
    }
    for (const PageRun& run : runs)
        check(run.count > 0 && run.first + run.count <= ram_pages, "a warm page run outside RAM was accepted");
    check(page_runs_from_json(runs_to_json(runs), ram_pages) == runs, "warm pages -> JSON -> warm pages differs");
}

void restore_serial(const json* j)
{
    const auto s = parse_state<Serial::State>(j, "serial");
    if (!s)
        return;
    Serial serial([](uint8_t) {});
    try {
        serial.restore(*s);
    } catch (const Error&) {
        return;
    }
    check(serial.save() == *s, "serial restore -> save differs");
}

// {"device": ..., "transport": ...} of virtio-vsock.
void restore_vsock(const json* part)
{
    if (!part)
        return;
    const auto s = parse_state<VirtioVsock::State>(member(*part, "device"), "vsock.device");
    if (!s) {
        parse_state<VirtioMmioTransport::State>(member(*part, "transport"), "vsock.transport");
        return;
    }
    NullBackend backend;
    VirtioVsock vsock(backend, 3);
    try {
        vsock.restore(*s);
    } catch (const Error&) {
        return;
    }
    check(vsock.save() == *s, "vsock restore -> save differs");
    restore_transport(*part, "vsock.transport", vsock);
}

void restore_blk(const json* part)
{
    if (!part)
        return;
    const auto s = parse_state<VirtioBlk::State>(member(*part, "device"), "blk.device");
    if (!s) {
        parse_state<VirtioMmioTransport::State>(member(*part, "transport"), "blk.transport");
        return;
    }
    VirtioBlk blk(CowDisk(base_image(), "fuzz base image"), loop());
    try {
        blk.restore(*s, base_image());  // a disk file as the snapshot's layer: any will do
    } catch (const Error&) {
        return;
    }
    check(blk.save() == *s, "virtio-blk restore -> save differs");
    restore_transport(*part, "blk.transport", blk);
}

// --- seeds: a state document as Vm::save_state writes it, from real devices ---------------

VcpuState sample_vcpu()
{
    VcpuState s;
    kvm_cpuid_entry2 leaf{};
    leaf.function = 0;
    leaf.eax = 0xd;
    s.cpuid.push_back(leaf);
    leaf.function = 1;
    leaf.ecx = 0x80000000;
    s.cpuid.push_back(leaf);
    s.mp_state.mp_state = KVM_MP_STATE_RUNNABLE;
    s.regs.rip = 0x100000;
    s.regs.rflags = 2;
    s.sregs.cr0 = 0x80050033;
    s.xsave.assign(min_xsave_bytes, 0);
    s.xcrs.nr_xcrs = 1;
    s.xcrs.xcrs[0].value = 7;
    s.msrs = {{0x10, 12345}, {0xc0000080, 0xd01}, {0x174, 0}};
    return s;
}

VmKvmState sample_vm()
{
    VmKvmState s;
    s.pic_master.chip_id = KVM_IRQCHIP_PIC_MASTER;
    s.pic_slave.chip_id = KVM_IRQCHIP_PIC_SLAVE;
    s.ioapic.chip_id = KVM_IRQCHIP_IOAPIC;
    s.clock.clock = 123456789;
    return s;
}

template <typename Device>
json driven_transport(Device& device, std::initializer_list<uint64_t> queue_bases)
{
    VirtioMmioTransport mmio(memory(), device, [] {}, [](uint16_t) {});
    const MmioDriver regs(mmio);
    regs.negotiate(device.device_features());
    uint32_t index = 0;
    for (const uint64_t base : queue_bases) {
        regs.wr(VIRTIO_MMIO_QUEUE_SEL, index++);
        regs.wr(VIRTIO_MMIO_QUEUE_NUM, 8);
        regs.wr(VIRTIO_MMIO_QUEUE_DESC_LOW, static_cast<uint32_t>(base));
        regs.wr(VIRTIO_MMIO_QUEUE_AVAIL_LOW, static_cast<uint32_t>(base + 0x100));
        regs.wr(VIRTIO_MMIO_QUEUE_USED_LOW, static_cast<uint32_t>(base + 0x200));
        regs.wr(VIRTIO_MMIO_QUEUE_READY, 1);
    }
    regs.wr(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK |
                                    VIRTIO_CONFIG_S_DRIVER_OK);
    return mmio.save();
}

Seeds make_seeds()
{
    json doc;
    doc["vcpus"] = json::array({vcpu_state_to_json(sample_vcpu())});
    doc["vm"] = vm_kvm_state_to_json(sample_vm());

    Serial serial([](uint8_t) {});
    serial.write(uart::lcr, 0x03);
    serial.write(uart::fcr, UART_FCR_ENABLE_FIFO);
    serial.write(uart::ier, UART_IER_RDI | UART_IER_THRI);
    for (uint8_t b : {'o', 'k'})
        serial.enqueue_input(b);
    doc["serial"] = serial.save();

    {
        VirtioBlk blk(CowDisk(base_image(), "fuzz base image"), loop());
        doc["blk"] = {{"transport", driven_transport(blk, {0x1000})}};
        CowDisk::State disk = blk.save().disk;
        disk.written.at(0) = 0x8001;  // sectors 0 and 15 live in the overlay
        doc["blk"]["device"] = VirtioBlk::State{disk};
    }
    {
        NullBackend backend;
        VirtioVsock vsock(backend, 3);
        const json transport = driven_transport(vsock, {0x2000, 0x2400, 0x2800});
        doc["vsock"] = {{"device", vsock.save()}, {"transport", transport}};
    }
    doc["memory"] = {{"warm_writes", state_codec::runs_to_json({{16, 4}, {100, 1}, {4000, 96}})}};

    Seeds seeds;
    seeds.emplace_back("state", encode_cbor(doc));
    json cold = doc;
    cold.erase("blk");
    seeds.emplace_back("no-blk", encode_cbor(cold));
    seeds.emplace_back("vsock", encode_cbor(doc["vsock"]));
    // The seeds must get past the parsers, or the fuzzer starts from refusals.
    for (const auto& [name, bytes] : seeds)
        decode_cbor(bytes);
    state_from_json<VirtioVsock::State>(doc["vsock"]["device"], "vsock.device");
    state_from_json<VirtioBlk::State>(doc["blk"]["device"], "blk.device");
    vcpu_state_from_json(doc["vcpus"][0]);
    vm_kvm_state_from_json(doc["vm"]);
    page_runs_from_json(doc["memory"]["warm_writes"], 64 * 256);
    return seeds;
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***)
{
    write_seeds_if_asked(make_seeds);
    quiet_logs();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
    json doc;
    try {
        doc = decode_cbor(std::span(data, size));
    } catch (const Error&) {
        return 0;
    }
    // What decode_cbor accepts, encode_cbor writes back in a form it accepts again, stably.
    const std::vector<uint8_t> encoded = encode_cbor(doc);
    try {
        check(encode_cbor(decode_cbor(encoded)) == encoded, "CBOR encode -> decode -> encode differs");
    } catch (const Error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        finding("decode_cbor refused what encode_cbor wrote");
    }

    if (const json* vcpus = member(doc, "vcpus"); vcpus && vcpus->is_array())
        for (const json& vcpu : *vcpus)
            parse_kvm_state<VcpuState>(vcpu, [](const json& j) { return vcpu_state_from_json(j); }, vcpu_state_to_json);
    if (const json* vm = member(doc, "vm"))
        parse_kvm_state<VmKvmState>(*vm, [](const json& j) { return vm_kvm_state_from_json(j); }, vm_kvm_state_to_json);
    restore_serial(member(doc, "serial"));
    restore_vsock(member(doc, "vsock"));
    restore_blk(member(doc, "blk"));
    if (const json* memory = member(doc, "memory"))
        parse_warm_pages(member(*memory, "warm_writes"));
    // The document may also be one device's part alone (the "vsock" seed).
    restore_vsock(&doc);
    return 0;
}
