#include "vmm/vm.hpp"

#include <pthread.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <system_error>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "devices/console_writer.hpp"
#include "devices/cow_disk.hpp"
#include "devices/serial.hpp"
#include "devices/state_json.hpp"
#include "devices/virtio_blk.hpp"
#include "devices/virtio_vsock.hpp"
#include "protocol/cmdline.hpp"
#include "vmm/boot.hpp"
#include "vmm/cpuid.hpp"
#include "common/error.hpp"
#include "core/layout.hpp"
#include "vmm/mptable.hpp"
#include "vmm/seccomp.hpp"
#include "vmm/snapshot_manifest.hpp"
#include "vmm/kvm_state_json.hpp"
#include "common/sparse_copy.hpp"
#include "vmm/vcpu_state.hpp"
#include "vmm/virtio_slot.hpp"
#include "vmm/vm_kvm_state.hpp"
#include "vmm/vm_limits.hpp"
#include "vmm/vsock_host.hpp"
#include "vmm/kvm.hpp"

namespace agentvm {
namespace {

// The panic line first (what a one-line error shows), then the oops that led to it: without
// it a panic under load on a remote machine cannot be told apart from any other.
std::string panic_detail(const std::string& panic_line, const std::string& context)
{
    if (context.empty())
        return panic_line;
    return panic_line + "\nthe guest console before it:\n" + context;
}

// KVM_SET_TSS_ADDR: three pages Intel VMX needs for real-mode emulation, placed just below
// the IOAPIC/LAPIC window where no RAM or device lives.
constexpr uint64_t tss_address = 0xfffbd000;

// Every agentvm guest is CID 3: each VM is its own process with its own device, so CIDs
// never need to differ between VMs.
constexpr uint64_t guest_cid = 3;

// The signal that kicks a vCPU thread out of KVM_RUN. Its handler does nothing: the point
// is the EINTR.
int kick_signal()
{
    return SIGRTMIN;
}

void install_kick_handler()
{
    static std::once_flag once;
    std::call_once(once, [] {
        struct sigaction sa {};
        sa.sa_handler = [](int) {};
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = 0;  // no SA_RESTART: KVM_RUN must return EINTR
        if (::sigaction(kick_signal(), &sa, nullptr) != 0)
            throw_errno("installing the vCPU kick signal handler");
    });
}

} // namespace

Vm::Vm(const Kvm& kvm, const VmConfig& config, GuestMemory mem, bool restoring)
    : kvm_(kvm), config_(config), vm_(kvm.create_vm()), mem_(std::move(mem))
{
    install_kick_handler();
    if (config.vcpus == 0 || config.vcpus > vcpu_limit(kvm))
        throw Error(fmt::format("--cpus {} is out of range: this host's KVM allows 1 to {} vCPUs",
                                config.vcpus, vcpu_limit(kvm)));
    // Memory first: once the irqchip exists, every memslot change waits out an SRCU grace
    // period in the kernel (5-10 ms measured on restore), before it almost nothing.
    map_memory();
    create_irqchip();
    add_serial(config.console_fd);
    if (config.rootfs_path)
        device_params_ = add_root_disk(config, restoring) + " ";
    device_params_ += add_vsock(config.vsock_uds);
}

Vm::Vm(const Kvm& kvm, const VmConfig& config)
    : Vm(kvm, config, GuestMemory(config.mem_mib * layout::mib), false)
{
    const auto kernel_image = read_kernel_file(config.kernel_path);
    const uint64_t needed = minimum_ram_for(kernel_image);
    if (config.mem_mib * layout::mib < needed)
        throw Error(fmt::format("--mem {} MiB is too small for kernel '{}': it needs at least {} MiB",
                                config.mem_mib, config.kernel_path,
                                (needed + layout::mib - 1) / layout::mib));

    const LoadedKernel kernel = load_kernel(mem_, kernel_image);
    cmdline_ = guest_cmdline(config, device_params_);
    write_boot_data(mem_, kernel, cmdline_);
    write_mptable(mem_, config.vcpus);
    create_vcpus(kernel);
}

Vm::Vm(const Kvm& kvm, const VmConfig& config, VmSnapshotData snapshot)
    : Vm(kvm, config, GuestMemory::from_snapshot(std::move(snapshot.memory), config.mem_mib * layout::mib,
                                                 "snapshot memory", std::move(snapshot.memory_layers)),
         true)
{
    if (config.live_snapshots) {
        pagemap_ = Fd(::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC));
        if (!pagemap_)
            throw_errno("opening /proc/self/pagemap (live snapshots find the pages a VM wrote there)");
        soft_dirty_ = std::make_unique<SoftDirtyBits>(pagemap_.get());
    }
    try {
        restore_state(snapshot.state, {std::move(snapshot.disk), std::move(snapshot.disk_layers)});
    } catch (const nlohmann::json::exception& e) {
        throw Error(fmt::format("snapshot: malformed state: {}", e.what()));
    }
    spdlog::debug("VM restored: {} vCPUs, {} MiB mapped from the snapshot", config.vcpus, config.mem_mib);
}

// run() joins every thread it starts before returning, so nothing runs by now.
Vm::~Vm() = default;

void Vm::create_irqchip()
{
    kvm_ioctl(vm_.get(), KVM_SET_TSS_ADDR, reinterpret_cast<const void*>(tss_address),
             "KVM_SET_TSS_ADDR");
    kvm_ioctl(vm_.get(), KVM_CREATE_IRQCHIP, nullptr, "KVM_CREATE_IRQCHIP");
    kvm_pit_config pit{};
    pit.flags = KVM_PIT_SPEAKER_DUMMY;  // port 0x61 reads without a speaker device
    kvm_ioctl(vm_.get(), KVM_CREATE_PIT2, &pit, "KVM_CREATE_PIT2");
}

void Vm::map_memory()
{
    uint32_t slot = 0;
    for (const auto& r : mem_.regions()) {
        kvm_userspace_memory_region region{};
        region.slot = slot++;
        region.guest_phys_addr = r.gpa;
        region.memory_size = r.size;
        region.userspace_addr = reinterpret_cast<uint64_t>(r.host);
        kvm_ioctl(vm_.get(), KVM_SET_USER_MEMORY_REGION, &region, "KVM_SET_USER_MEMORY_REGION");
    }
}

void Vm::add_serial(int console_fd)
{
    const int vm_fd = vm_.get();
    serial_ = std::make_unique<SerialDevice>([vm_fd](bool level) {
        kvm_irq_level irq{};
        irq.irq = layout::serial_irq;
        irq.level = level ? 1 : 0;
        if (::ioctl(vm_fd, KVM_IRQ_LINE, &irq) < 0)
            SPDLOG_WARN("KVM_IRQ_LINE for the serial port failed: {}", strerror(errno));
    });
    // A kernel that panicked is ended at once: panic=-1 reboots it (a triple fault, seen as
    // power-off), but a panic whose own path faults again, or a command line that asked for
    // panic=0, would otherwise leave the VM spinning until whoever waits on it gives up.
    serial_->set_panic_seen([this] {
        stop(VmOutcome::panicked, panic_detail(serial_->panic_line().value_or(""), serial_->panic_context()));
    });
    pio_.insert(layout::com1_port, layout::com1_ports, *serial_);
    if (console_fd >= 0)
        console_ = std::make_unique<ConsoleWriter>(loop_, *serial_, console_fd);

    VmDevice row;
    row.key = "serial";
    row.name = "the serial port";
    row.save = [this] { return nlohmann::json(serial_->save()); };
    row.decode = [this](const nlohmann::json& part, SnapshotFiles&) -> std::function<void()> {
        return [this, s = state_from_json<Serial::State>(part, "serial")] { serial_->restore(s); };
    };
    if (console_) {
        // Its reader may never read again: the write in flight must not hold up the drain.
        row.quiesce = [this] { console_->stop(); };
        row.finish = [this] { console_->finish(); };
    }
    devices_.push_back(std::move(row));
}

std::string Vm::add_root_disk(const VmConfig& config, bool restoring)
{
    CowDisk disk(*config.rootfs_path, config.overlay_dir, config.disk_bytes);
    if (config.rootfs_layer && !restoring) {
        const std::string& path = config.rootfs_layer->path;
        Fd layer(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
        if (!layer)
            throw_errno(fmt::format("opening the root disk's layer '{}'", path));
        struct stat st {};
        if (::fstat(layer.get(), &st) != 0)
            throw_errno(fmt::format("stat '{}'", path));
        if (static_cast<uint64_t>(st.st_size) != disk.capacity_sectors() * CowDisk::sector_size)
            throw Error(fmt::format("the root disk's layer '{}' holds {} bytes, the disk {}", path, st.st_size,
                                    disk.capacity_sectors() * CowDisk::sector_size));
        disk.add_layer(std::move(layer), config.rootfs_layer->byte_ranges);
    }
    blk_ = std::make_unique<VirtioBlk>(std::move(disk), loop_, "agentvm-root");
    blk_slot_ = std::make_unique<VirtioSlot>(vm_.get(), mem_, loop_, mmio_, *blk_,
                                             layout::virtio_mmio_base, layout::first_virtio_irq);
    std::string params = blk_slot_->cmdline_param();
    if (blk_->disk().capacity_sectors() > blk_->disk().base_sectors())
        params.append(" ").append(grow_root_param);

    VmDevice row;
    row.key = "blk";
    row.name = "the disk";
    row.save = [this] {
        return nlohmann::json{{"device", blk_->save()}, {"transport", blk_slot_->transport().save()}};
    };
    row.decode = [this](const nlohmann::json& part, SnapshotFiles& files) -> std::function<void()> {
        auto device = state_from_json<VirtioBlk::State>(part.at("device"), "blk.device");
        auto transport = state_from_json<VirtioMmioTransport::State>(part.at("transport"), "blk.transport");
        return [this, &files, device = std::move(device), transport = std::move(transport)] {
            // The sectors the guest had written live in the snapshot's disk file, which this
            // VM reads as a layer under its own overlay: every clone shares it, a restore
            // copies nothing, and the snapshot stays as it was.
            if (files.disk_layers.empty())
                blk_->restore(device, std::move(files.disk));
            else
                blk_->restore(device, std::move(files.disk_layers));
            blk_slot_->transport().restore(transport);
        };
    };
    row.slot = blk_slot_.get();
    row.busy = [this] { return blk_->in_flight() > 0; };
    // A vCPU waiting in a reset for the disk's requests would otherwise never be joined.
    row.release_vcpus = [this] { blk_->abandon_resets(); };
    devices_.push_back(std::move(row));
    return params;
}

std::string Vm::add_vsock(const std::optional<std::string>& uds_path)
{
    vsock_host_ = std::make_unique<VsockHost>(loop_, uds_path);
    vsock_ = std::make_unique<VirtioVsock>(*vsock_host_, guest_cid);
    vsock_host_->attach(*vsock_);
    vsock_slot_ = std::make_unique<VirtioSlot>(vm_.get(), mem_, loop_, mmio_, *vsock_,
                                               layout::virtio_mmio_base + layout::virtio_mmio_size,
                                               layout::first_virtio_irq + 1);

    VmDevice row;
    row.key = "vsock";
    row.name = "vsock";
    row.save = [this] {
        return nlohmann::json{{"device", vsock_->save()}, {"transport", vsock_slot_->transport().save()}};
    };
    row.decode = [this](const nlohmann::json& part, SnapshotFiles&) -> std::function<void()> {
        auto device = state_from_json<VirtioVsock::State>(part.at("device"), "vsock.device");
        auto transport = state_from_json<VirtioMmioTransport::State>(part.at("transport"), "vsock.transport");
        return [this, device, transport = std::move(transport)] {
            vsock_->restore(device);
            vsock_slot_->transport().restore(transport);
        };
    };
    // Host streams did not survive: the guest must drop its connections too, and reconnect.
    // Only once KVM's state is back, or the event's interrupt would be lost with the old one.
    row.restored = [this] { vsock_->send_transport_reset(); };
    row.slot = vsock_slot_.get();
    // Host streams are shut first, or their pending reads would keep the loop busy.
    row.quiesce = [this] { vsock_host_->close_all(); };
    devices_.push_back(std::move(row));
    return vsock_slot_->cmdline_param();
}

void Vm::create_vcpus(const LoadedKernel& kernel)
{
    const auto supported = kvm_.supported_cpuid();
    const bool tsc_deadline = kvm_.check_extension(KVM_CAP_TSC_DEADLINE_TIMER) > 0;
    for (uint32_t i = 0; i < config_.vcpus; ++i) {
        auto vcpu = std::make_unique<Vcpu>(kvm_, vm_.get(), i);
        // KVM wants CPUID set before any other vCPU state.
        vcpu->set_cpuid(adjust_cpuid(supported, {i, config_.vcpus, tsc_deadline}));
        vcpu->set_msrs(boot_msrs());
        vcpu->set_local_interrupts();
        if (i == 0) {
            // Only the boot vCPU starts at the kernel entry; the others wait in KVM for the
            // INIT/SIPI the kernel sends through the in-kernel LAPIC.
            vcpu->set_regs(boot_regs(kernel));
            auto sregs = vcpu->sregs();
            set_boot_sregs(sregs);
            vcpu->set_sregs(sregs);
            vcpu->set_fpu(boot_fpu());
        }
        vcpus_.push_back(std::move(vcpu));
    }
}

Fd Vm::connect_vsock(uint32_t port)
{
    return vsock_host_->connect_internal(port);
}

nlohmann::json Vm::save_state() const
{
    nlohmann::json vcpus = nlohmann::json::array();
    for (const auto& vcpu : vcpus_)
        vcpus.push_back(vcpu_state_to_json(save_vcpu_state(kvm_, vcpu->fd())));
    nlohmann::json state;
    state["vcpus"] = std::move(vcpus);
    state["vm"] = vm_kvm_state_to_json(save_vm_kvm_state(vm_.get()));
    for (const VmDevice& device : devices_)
        state[device.key] = device.save();
    state["memory"] = {{"warm_writes", state_codec::runs_to_json(warm_writes_)}};
    return state;
}

void Vm::start_write_log()
{
    WriteLog::start(vm_.get(), mem_);
}

void Vm::stop_write_log()
{
    warm_writes_ = WriteLog::stop(vm_.get(), mem_);
}

void Vm::save_memory(int fd) const
{
    mem_.save_to(fd);
}

void Vm::save_disk(int fd) const
{
    if (!blk_)
        return;
    const CowDisk& disk = blk_->disk();
    const uint64_t size = disk.capacity_sectors() * CowDisk::sector_size;
    for (size_t i = 0; i < disk.layer_count(); ++i)
        copy_ranges(disk.layer_fd(i), fd, disk.layer_byte_ranges(i), size, "a disk layer into the snapshot");
    copy_ranges(disk.overlay_fd(), fd, disk.overlay_byte_ranges(), size, "the disk overlay into the snapshot");
}

ByteRanges Vm::start_live_copy()
{
    if (!pagemap_)
        throw Error("this VM was not restored for live snapshots: it cannot tell the pages it wrote");
    if (!blk_)
        return {};
    CowDisk& disk = blk_->disk();
    disk.track_writes();
    return disk.overlay_byte_ranges();
}

void Vm::copy_live(LiveCopy& copy, const ByteRanges& disk, int memory_fd, int disk_fd) const
{
    copy.pages_tracked = soft_dirty_->clear();
    if (!copy.pages_tracked)
        spdlog::warn("this kernel keeps no soft-dirty bits (CONFIG_MEM_SOFT_DIRTY): a live snapshot copies all the "
                     "VM's pages again while it is paused");
    // Each run is one mapping in every VM restored from the snapshot: merged across gaps
    // (whose pages are written too, as they are now) until there are few enough.
    copy.pages = merge_runs(mem_.private_pages(pagemap_.get()).owned, snapshot_page_gap, max_snapshot_page_runs);
    copy.running_bytes += mem_.save_pages_to(memory_fd, copy.pages);
    copy.disk = disk;
    if (blk_)
        copy.running_bytes += copy_ranges(blk_->disk().overlay_fd(), disk_fd, disk,
                                          blk_->disk().capacity_sectors() * CowDisk::sector_size,
                                          "the disk overlay into the snapshot");
}

void Vm::finish_live_copy(LiveCopy& copy, int memory_fd, int disk_fd)
{
    const GuestMemory::PrivatePages now = mem_.private_pages(pagemap_.get());
    std::vector<IndexRun> runs = merge_runs(now.owned, snapshot_page_gap, max_snapshot_page_runs);
    const PausedPages paused = paused_pages(mem_.ram_size() / layout::page_size, runs, copy.pages,
                                            copy.pages_tracked, now.soft_dirty);
    copy.paused_bytes += mem_.save_pages_to(memory_fd, paused.write, true);
    for (const IndexRun& run : paused.punch)
        if (::fallocate(memory_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                        static_cast<off_t>(run.first * layout::page_size),
                        static_cast<off_t>(run.count * layout::page_size)) != 0)
            throw_errno("punching pages the VM no longer owns out of the snapshot memory file");
    copy.pages = std::move(runs);
    if (!blk_)
        return;
    CowDisk& disk = blk_->disk();
    copy.paused_bytes += copy_ranges(disk.overlay_fd(), disk_fd, disk.tracked_byte_ranges(),
                                     disk.capacity_sectors() * CowDisk::sector_size, "the disk overlay into the snapshot");
    copy.disk = disk.overlay_byte_ranges();
}

void Vm::in_background(std::function<void()> work, LoopWorker::Done done)
{
    if (!worker_) {
        done(std::make_exception_ptr(Error("this VM takes no live snapshots, or is not running")));
        return;
    }
    worker_->post(std::move(work), std::move(done));
}

uint64_t Vm::disk_bytes() const
{
    return blk_ ? blk_->disk().capacity_sectors() * CowDisk::sector_size : 0;
}

void Vm::restore_state(const nlohmann::json& state, SnapshotFiles files)
{
    // Everything is decoded and checked before KVM or a device sees any of it.
    const nlohmann::json& vcpu_docs = state.at("vcpus");
    if (!vcpu_docs.is_array() || vcpu_docs.size() != config_.vcpus)
        throw Error(fmt::format("snapshot: vcpus: {} saved, the snapshot records {}",
                                vcpu_docs.is_array() ? vcpu_docs.size() : 0, config_.vcpus));
    std::vector<VcpuState> vcpu_states;
    for (size_t i = 0; i < vcpu_docs.size(); ++i)
        vcpu_states.push_back(vcpu_state_from_json(vcpu_docs[i], state_codec::element("vcpus", i)));
    const VmKvmState vm_state = vm_kvm_state_from_json(state.at("vm"));
    if (state.contains("blk") != static_cast<bool>(blk_))
        throw Error("snapshot: blk: the snapshot and this VM disagree on having a root disk");
    std::vector<std::function<void()>> restore_devices;
    for (VmDevice& device : devices_)
        restore_devices.push_back(device.decode(state.at(device.key), files));
    const std::vector<PageRun> warm = page_runs_from_json(state.at("memory").at("warm_writes"),
                                                          mem_.ram_size() / 4096);

    for (const auto& restore : restore_devices)
        restore();

    copy_warm_pages(mem_, warm);
    warm_writes_ = warm;  // a live snapshot of this VM passes them on

    // KVM: vCPUs first, then the VM-wide state (see restore_vm_kvm_state for why).
    for (uint32_t i = 0; i < config_.vcpus; ++i) {
        auto vcpu = std::make_unique<Vcpu>(kvm_, vm_.get(), i);
        restore_vcpu_state(kvm_, vcpu->fd(), vcpu_states[i]);
        vcpus_.push_back(std::move(vcpu));
    }
    restore_vm_kvm_state(vm_.get(), vm_state);

    for (const VmDevice& device : devices_)
        if (device.restored)
            device.restored();
}

void Vm::console_input(std::span<const uint8_t> bytes)
{
    serial_->push_input(bytes);
}

void Vm::stop(VmOutcome outcome, std::string detail)
{
    {
        std::lock_guard lock(result_mutex_);
        if (!result_)
            result_ = VmResult{outcome, std::move(detail)};
    }
    gate_.stop();
    // run() wakes from the loop and kicks the vCPUs; doing it here from a vCPU thread would
    // race with run() joining them.
    loop_.stop();
}

void Vm::kick_vcpus()
{
    for (size_t i = 0; i < vcpus_.size(); ++i) {
        vcpus_[i]->request_exit();
        if (i < threads_.size())
            ::pthread_kill(threads_[i].native_handle(), kick_signal());
    }
}

void Vm::vcpu_loop(Vcpu& vcpu)
{
    try {
        if (config_.jail)
            install_seccomp(SeccompRole::vcpu);
        while (!gate_.stopping()) {
            if (gate_.pause_requested()) {
                park(vcpu);
                continue;
            }
            const ExitOutcome outcome = handle_exit(vcpu.run(), pio_, mmio_);
            switch (outcome.action) {
            case ExitAction::resume:
            case ExitAction::check_stop:
                break;
            case ExitAction::power_off:
                if (auto panic = serial_->panic_line())
                    stop(VmOutcome::panicked, panic_detail(*panic, serial_->panic_context()));
                else
                    stop(VmOutcome::powered_off, outcome.why);
                break;
            case ExitAction::fail:
                stop(VmOutcome::failed, fmt::format("vCPU {}: {}", vcpu.index(), outcome.why));
                break;
            }
        }
        // KVM finishes an I/O or MMIO instruction only on the next entry: enter once more
        // with an exit already requested, so the vCPU's state is whole for a snapshot.
        vcpu.request_exit();
        vcpu.run();
    } catch (const std::exception& e) {
        stop(VmOutcome::failed, fmt::format("vCPU {}: {}", vcpu.index(), e.what()));
    }
}

void Vm::park(Vcpu& vcpu)
{
    // As when stopping: the last exit's I/O completes on one more entry, exit requested.
    vcpu.request_exit();
    vcpu.run();
    gate_.park();
    vcpu.clear_exit_request();
}

void Vm::pause(std::function<void(const std::string& error)> paused, std::chrono::milliseconds patience)
{
    if (!gate_.request_pause()) {
        paused(gate_.stopping() ? "the VM stopped" : "the VM is being paused already");
        return;
    }
    on_paused_ = std::move(paused);
    pause_deadline_ = std::chrono::steady_clock::now() + patience;
    kick_vcpus();
    // Parked vCPUs take microseconds; a vCPU waiting for the loop (a device reset draining its
    // I/O) needs the loop to run, so the wait is short and then polled.
    gate_.wait_parked(std::chrono::milliseconds(2));
    poll_pause();
}

void Vm::poll_pause()
{
    const auto finish = [this](const std::string& error) {
        auto paused = std::move(on_paused_);
        on_paused_ = nullptr;
        if (!error.empty())
            resume();
        paused(error);
    };
    const PauseGate::State state = gate_.state();
    if (state == PauseGate::State::stopping) {
        finish("the VM stopped");
        return;
    }
    const VmDevice* busy = nullptr;
    if (state == PauseGate::State::parked) {
        // Requests the guest made just before it was parked may not have reached the loop.
        for (const VmDevice& device : devices_)
            if (device.slot)
                device.slot->take_notifications();
        for (const VmDevice& device : devices_)
            if (!busy && device.busy && device.busy())
                busy = &device;
        if (!busy) {
            finish("");
            return;
        }
    }
    if (std::chrono::steady_clock::now() >= pause_deadline_) {
        finish(busy ? fmt::format("{} did not finish its requests in time", busy->name) : "the vCPUs did not stop in time");
        return;
    }
    if (!pause_poll_)
        pause_poll_ = std::make_unique<LoopTimer>(loop_, [this] { poll_pause(); });
    pause_poll_->arm(std::chrono::microseconds(200));
}

void Vm::resume()
{
    gate_.resume();
}

VmResult Vm::run()
{
    vsock_host_->update_stream_cap();
    gate_.set_vcpus(vcpus_.size());
    try {
        for (auto& vcpu : vcpus_)
            threads_.emplace_back([this, v = vcpu.get()] { vcpu_loop(*v); });
    } catch (const std::system_error& e) {
        // Out of threads (a pids limit, memory): the vCPUs already started are stopped and
        // joined below like on any other failure; the loop returns at once.
        stop(VmOutcome::failed, fmt::format("starting the thread of vCPU {}: {}", threads_.size(), e.what()));
    }
    try {
        if (config_.live_snapshots)
            worker_ = std::make_unique<LoopWorker>(loop_, [this] {
                if (config_.jail && config_.run_thread_filter)
                    install_seccomp(SeccompRole::snapshot_worker);
            });
        if (config_.jail && config_.run_thread_filter)
            install_seccomp(*config_.run_thread_filter);
        loop_.run();
    } catch (const std::exception& e) {
        stop(VmOutcome::failed, fmt::format("I/O loop: {}", e.what()));
    }
    gate_.stop();  // parked vCPUs end too
    for (const VmDevice& device : devices_)
        if (device.release_vcpus)
            device.release_vcpus();
    kick_vcpus();
    for (auto& t : threads_)
        t.join();
    // The worker may be reading guest RAM; what it was doing is reported failed or done.
    if (worker_)
        worker_->stop();
    // In-flight disk I/O targets guest memory: let it finish before anything is torn down,
    // once nothing keeps the loop waiting that the VM cannot finish by itself.
    for (const VmDevice& device : devices_)
        if (device.quiesce)
            device.quiesce();
    for (auto& hook : stopping_hooks_)
        hook();
    for (;;) {
        // Completions still run while draining, and one may fail like any other: the VM
        // has failed then, and the rest must still be waited for.
        try {
            loop_.drain();
            break;
        } catch (const std::exception& e) {
            stop(VmOutcome::failed, fmt::format("I/O loop: {}", e.what()));
        }
    }
    for (const VmDevice& device : devices_)
        if (device.finish)
            device.finish();
    std::lock_guard lock(result_mutex_);
    return result_.value_or(VmResult{VmOutcome::stopped, "stopped"});
}

} // namespace agentvm
