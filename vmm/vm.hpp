// One microVM: KVM VM, guest RAM, buses, devices, vCPU threads and the I/O loop, held as
// members in dependency order so construction follows boot order and destruction tears down
// in reverse. run() blocks until the guest powers off, fails, or stop() is called.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "vmm/boot.hpp"
#include "core/bus.hpp"
#include "core/event_loop.hpp"
#include "common/fd.hpp"
#include "core/guest_memory.hpp"
#include "core/loop_timer.hpp"
#include "core/loop_worker.hpp"
#include "core/soft_dirty.hpp"
#include "vmm/kvm.hpp"
#include "vmm/live_copy.hpp"
#include "vmm/pause_gate.hpp"
#include "vmm/vcpu.hpp"
#include "vmm/vm_config.hpp"
#include "vmm/vm_device.hpp"
#include "vmm/warm_pages.hpp"

namespace agentvm {

class ConsoleWriter;
class SerialDevice;
class VirtioBlk;
class VirtioSlot;
class VirtioVsock;
class VsockHost;

enum class VmOutcome {
    powered_off,  // the guest rebooted or powered off
    panicked,     // the guest kernel panicked (detail: the panic line, then the console before it)
    failed,       // a vCPU or device failed (detail: why)
    stopped,      // stop() was called, e.g. on SIGINT/SIGTERM
    finished,     // the host was done with the guest (agentvm run, episode): not an error
};

struct VmResult {
    VmOutcome outcome;
    std::string detail;
};

// What a VM resumes from (see vmm/snapshot.hpp for the files): the state document (vCPUs,
// VM-wide KVM state, devices) and the files with guest memory and the disk's written sectors.
// A live snapshot is a chain: the first snapshot's full memory, each later one's pages over
// it; and every snapshot's disk file with the ranges it holds (disk_layers, lowest first,
// instead of `disk`).
struct VmSnapshotData {
    nlohmann::json state;
    Fd memory;
    Fd disk;
    std::vector<MemoryLayer> memory_layers;
    std::vector<std::pair<Fd, ByteRanges>> disk_layers;
};

class Vm {
public:
    // Builds the whole VM; throws Error naming the first problem (bad kernel, too little
    // memory, missing rootfs, KVM failure). Nothing is left behind on failure.
    Vm(const Kvm& kvm, const VmConfig& config);
    // Builds the VM as the snapshot left it, ready to run on. config gives the rootfs, the
    // console and the vsock socket, and must name the vCPU count and memory size the snapshot
    // records. Throws Error for a state that does not fit (nothing is left behind).
    Vm(const Kvm& kvm, const VmConfig& config, VmSnapshotData snapshot);
    ~Vm();
    Vm(const Vm&) = delete;
    Vm& operator=(const Vm&) = delete;

    // Runs the guest on vCPU threads and the I/O loop on the calling thread.
    VmResult run();
    // Thread-safe: ends run() with `outcome` unless it has already ended.
    void stop(VmOutcome outcome, std::string detail);

    // Runs on run()'s thread once the guest has stopped, before in-flight I/O is drained:
    // owners of I/O the VM cannot finish by itself (a write to a stdout nobody reads) cancel
    // it here.
    void on_stopping(std::function<void()> hook) { stopping_hooks_.push_back(std::move(hook)); }

    // Before run(): tests add devices, the CLI adds its stdin/signal watches.
    Bus& pio_bus() { return pio_; }
    Bus& mmio_bus() { return mmio_; }
    EventLoop& event_loop() { return loop_; }
    const GuestMemory& memory() const { return mem_; }
    Vcpu& vcpu(size_t index) { return *vcpus_.at(index); }

    // Baking, on the I/O loop's thread: KVM logs the guest pages the vCPUs write from start
    // to stop, and save_state() records them as the snapshot's warm pages (vmm/warm_pages.hpp).
    void start_write_log();
    void stop_write_log();

    // Live snapshots, on the I/O loop's thread while run() runs. pause() parks every vCPU
    // outside KVM_RUN with its last exit completed, starts the queue work the guest asked for
    // before, and once the disk has no request in flight calls `paused` with an empty error on
    // the loop's thread: the VM's state is whole then for save_state() and the save functions
    // until resume(). If that takes longer than `patience`, or the VM stops, `paused` gets why
    // and the VM runs on. One pause at a time.
    void pause(std::function<void(const std::string& error)> paused, std::chrono::milliseconds patience);
    void resume();
    // Whether RAM is mapped from a snapshot: its live snapshots store only what it wrote since.
    bool restored() const { return mem_.from_snapshot_file(); }

    // A host connection to the guest's vsock port (see VsockHost::connect_internal). On the
    // I/O loop's thread, or before run().
    Fd connect_vsock(uint32_t port);
    // After run() has returned (every vCPU stopped with its last exit completed, device I/O
    // drained): the state document of a snapshot, and the files it refers to.
    nlohmann::json save_state() const;
    void save_memory(int fd) const;
    void save_disk(int fd) const;
    // Live snapshots of a restored VM (config.live_snapshots), copied mostly while it runs
    // (vmm/live_copy.hpp). On the loop's thread, running: start_live_copy() starts tracking
    // the disk's writes and returns the overlay's ranges to copy. On the worker thread
    // (in_background), running: copy_live() clears the soft-dirty bits, then writes the pages
    // the VM owns (runs merged across small gaps, so that a restore maps few of them) and
    // those ranges into the files at their offsets. On the loop's thread, paused:
    // finish_live_copy() writes again what was written since, and leaves in `copy` what the
    // files hold.
    ByteRanges start_live_copy();
    void copy_live(LiveCopy& copy, const ByteRanges& disk, int memory_fd, int disk_fd) const;
    void finish_live_copy(LiveCopy& copy, int memory_fd, int disk_fd);
    // While run() runs, with config.live_snapshots: `work` on the VM's worker thread, then
    // `done` on the loop's thread (core/loop_worker.hpp).
    void in_background(std::function<void()> work, LoopWorker::Done done);
    // The root disk's size in bytes; 0 without one.
    uint64_t disk_bytes() const;

    // Bytes typed at the guest's serial console. Called on the I/O loop's thread.
    void console_input(std::span<const uint8_t> bytes);
    const std::string& cmdline() const { return cmdline_; }
    const VmConfig& config() const { return config_; }

private:
    // What booting and restoring share: the VM, its memory and its devices, not yet the vCPUs.
    // restoring: the snapshot supplies the disk's written sectors, so config's rootfs layer
    // is not opened.
    Vm(const Kvm& kvm, const VmConfig& config, GuestMemory mem, bool restoring);
    void create_irqchip();
    void map_memory();
    void add_serial(int console_fd);
    std::string add_root_disk(const VmConfig& config, bool restoring);
    std::string add_vsock(const std::optional<std::string>& uds_path);
    void create_vcpus(const LoadedKernel& kernel);
    void restore_state(const nlohmann::json& state, SnapshotFiles files);
    void vcpu_loop(Vcpu& vcpu);
    void park(Vcpu& vcpu);
    void kick_vcpus();  // only from the thread in run()
    void poll_pause();

    const Kvm& kvm_;
    VmConfig config_;
    Fd vm_;
    GuestMemory mem_;
    Bus pio_;
    Bus mmio_;
    EventLoop loop_;
    std::unique_ptr<SerialDevice> serial_;
    std::unique_ptr<ConsoleWriter> console_;  // after serial_: it attaches to the device
    std::unique_ptr<VirtioBlk> blk_;
    std::unique_ptr<VirtioSlot> blk_slot_;  // after blk_: its transport refers to the device
    std::unique_ptr<VsockHost> vsock_host_;  // before vsock_: the device calls back into it
    std::unique_ptr<VirtioVsock> vsock_;
    std::unique_ptr<VirtioSlot> vsock_slot_;
    std::vector<VmDevice> devices_;  // every device above, in boot order
    std::string device_params_;
    std::string cmdline_;
    std::vector<std::unique_ptr<Vcpu>> vcpus_;
    std::vector<std::thread> threads_;
    std::vector<std::function<void()>> stopping_hooks_;

    std::vector<PageRun> warm_writes_;
    Fd pagemap_;  // /proc/self/pagemap, for a restored VM with config.live_snapshots
    std::unique_ptr<SoftDirtyBits> soft_dirty_;  // likewise
    std::unique_ptr<LoopWorker> worker_;  // while run() runs, with config.live_snapshots

    // pause() and stop(): where the vCPU threads park, and whether they go on.
    PauseGate gate_;
    // The pause under way, on the loop's thread: whom to tell, and until when to wait.
    std::function<void(const std::string&)> on_paused_;
    std::chrono::steady_clock::time_point pause_deadline_;
    std::unique_ptr<LoopTimer> pause_poll_;

    std::mutex result_mutex_;
    std::optional<VmResult> result_;
};

} // namespace agentvm
