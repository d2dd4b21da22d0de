#include <CLI/CLI.hpp>

#include "cli/vm_options.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cli/seconds_option.hpp"
#include "cli/template_options.hpp"
#include "protocol/cmdline.hpp"
#include "common/error.hpp"
#include "core/layout.hpp"
#include "devices/cow_disk.hpp"
#include "templates/template_store.hpp"
#include "vmm/vm_limits.hpp"

namespace agentvm {

bool VmOptions::given(const char* flag) const
{
    // A flag this role does not have was not given.
    return command_ && command_->get_option_no_throw(flag) != nullptr && command_->count(flag) > 0;
}

namespace {

// Host memory a VMM needs beyond guest memory: its own code and heap, device buffers, io_uring,
// the page cache of its disk and snapshot files. The default limit leaves room; below the
// minimum a VMM cannot work.
constexpr uint64_t vmm_overhead_mib = 256;
constexpr uint64_t vmm_minimum_overhead_mib = 64;
// Threads of one VMM: a vCPU each, the I/O loop, and io_uring's workers for blocking I/O.
constexpr uint64_t vmm_max_tasks = 512;
// cgroup v2's cpu.max quota for a core count: ample for any host, far inside its range.
constexpr double max_cpu_quota_cores = 4096;
constexpr uint64_t file_size_slack = 64 * layout::mib;
constexpr uint64_t max_disk_mib = CowDisk::max_capacity_bytes / layout::mib;

void require_readable_file(const std::string& path, const char* what, const char* flag)
{
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
        throw_errno(fmt::format("{} '{}' (set with {})", what, path, flag));
    if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode))
        throw Error(fmt::format("{} '{}' is not a file", what, path));
    if (::access(path.c_str(), R_OK) != 0)
        throw_errno(fmt::format("{} '{}' is not readable", what, path));
}

uint64_t file_size(const std::string& path)
{
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
        throw_errno(fmt::format("stat '{}'", path));
    return static_cast<uint64_t>(st.st_size);
}

uint64_t disk_size(const VmConfig& config)
{
    return config.disk_bytes != 0 ? config.disk_bytes : file_size(*config.rootfs_path);
}

// A --disk-size must hold the image, and its overlay, which a guest rewriting its whole disk
// fills, must fit where it lives: the disk's size is what keeps the guest from filling the
// host's.
void check_disk_size(const VmConfig& config)
{
    const uint64_t image = file_size(*config.rootfs_path);
    if (config.disk_bytes < image)
        throw Error(fmt::format("--disk-size {} MiB is smaller than the root filesystem image '{}' ({:.1f} MiB): "
                                "the guest's filesystem can grow, not shrink",
                                config.disk_bytes / layout::mib, *config.rootfs_path,
                                static_cast<double>(image) / layout::mib));
    struct statvfs fs {};
    if (::statvfs(config.overlay_dir.c_str(), &fs) != 0)
        throw_errno(fmt::format("the disk overlay's directory '{}' (TMPDIR)", config.overlay_dir));
    const uint64_t available = uint64_t{fs.f_bavail} * fs.f_frsize;
    if (config.disk_bytes > available)
        throw Error(fmt::format("--disk-size {} MiB is more than the {} MiB free in '{}', where the disk's overlay "
                                "lives (TMPDIR): a guest filling its disk would fill the host's",
                                config.disk_bytes / layout::mib, available / layout::mib, config.overlay_dir));
}

// Whether files in `dir` live in memory (tmpfs, ramfs).
bool memory_backed(const std::string& dir)
{
    struct statfs fs {};
    return ::statfs(dir.c_str(), &fs) == 0 && (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC);
}

} // namespace

std::string agentvm_binary()
{
    std::error_code ec;
    const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec)
        throw Error("cannot locate the agentvm binary through /proc/self/exe: " + ec.message());
    return exe.string();
}

std::string default_guest_file(const std::string& name)
{
    return (std::filesystem::path(agentvm_binary()).parent_path() / "guest" / name).string();
}

VmOptions::VmOptions(VmRole role) : role_(role), console_(role == VmRole::boot ? "-" : "")
{
}

void VmOptions::add_to(CLI::App& command)
{
    command_ = &command;
    command.add_option("--kernel", kernel_, "guest kernel: vmlinux ELF or bzImage (default: the one set-up built)");
    command.add_option("--rootfs", rootfs_, "root filesystem image, opened read-only (default: the one set-up built)");
    command.add_option("--cpus", cpus_, "number of vCPUs")->capture_default_str();
    command.add_option("--mem", mem_mib_, "guest memory in MiB")->capture_default_str();
    command.add_option("--disk-size", disk_mib_,
                       "root disk size in MiB, at least the rootfs image's: the guest's filesystem grows to fill "
                       "it at boot, and its writes meet ENOSPC there (default: the image's size)")
        ->check(CLI::PositiveNumber);
    command.add_option("--guest-pids", guest_pids_,
                       "processes and threads the guest's tool calls may have at once")
        ->capture_default_str()
        ->check(CLI::Range(uint32_t{1}, max_pids_max));
    command.add_option("--cmdline", cmdline_, "extra kernel command-line parameters");
    if (role_ == VmRole::boot)
        command.add_option("--init-cmd", init_cmd_, "command the guest init runs with /bin/sh -c, then powers off");
    command.add_option("--vsock-uds", vsock_uds_,
                       "Unix socket for the guest's vsock: connect and write 'CONNECT <port>\\n' to reach a "
                       "guest port; the guest reaches host port P at <path>_P");
    auto* console = command.add_option(
        "--console", console_, "where the guest serial console goes: a file path, or - for stderr");
    if (role_ == VmRole::agent) {
        command.add_option("--snapshot", snapshot_,
                           "restore from this snapshot (agentvm snapshot bake) instead of booting");
        command.add_flag("--cold", cold_, "boot, even where set-up's default snapshot exists");
        command.add_option("--template", template_,
                           "run template NAME (agentvm template build): its image, restored from its snapshot once "
                           "baked; 'default' is set-up's own guest");
    }
    if (role_ == VmRole::bake)
        command.add_option("--template", template_,
                           "boot template NAME's image (agentvm template build): its shared base and its own "
                           "blocks over it (agentvm template bake runs this)");
    if (role_ == VmRole::agent || role_ == VmRole::bake)
        command.add_option("--template-store", template_store_,
                           "where templates are (default: AGENTVM_TEMPLATES, else /var/lib/agentvm/templates)");
    command.add_flag("--no-jail", no_jail_,
                     "debugging only: run the VMM without its jail, seccomp filters and cgroup limits "
                     "(a hostile guest then meets fewer walls)");
    command.add_option("--cpu-quota", cpu_quota_,
                       "host CPU time the VMM may use, in cores (default: one per vCPU; 0: no quota)")
        ->check(bounded_number(max_cpu_quota_cores, "cores"));
    command.add_option("--cpu-weight", cpu_weight_,
                       "the VMM's share of contended host CPU against other VMMs, 1-10000 (cgroup cpu.weight; "
                       "default 100); agentvm serve starts its pool's VMs low")
        ->check(CLI::Range(1u, 10000u));
    command.add_option("--vmm-mem", vmm_mem_mib_,
                       fmt::format("host memory the VMM may use in MiB, guest memory included (default: --mem + {}, "
                                   "plus the disk's size when TMPDIR is tmpfs; 0: no limit)",
                                   vmm_overhead_mib))
        ->check(CLI::NonNegativeNumber);
    if (role_ == VmRole::agent)
        command.add_option("--episode-timeout", episode_timeout_s_,
                           "seconds the whole episode may last; then every pending call fails and the VM stops "
                           "(0: no limit)")
            ->capture_default_str()
            ->check(seconds_option(true));
    if (role_ == VmRole::boot)
        console->capture_default_str();
    else
        console->description(console->get_description() + " (default: dropped)");
}

VmConfig VmOptions::resolve()
{
    VmConfig config;
    config.jail = !no_jail_;
    config.live_snapshots = live_snapshots_;
    config.run_thread_filter =
        role_ == VmRole::bake || live_snapshots_ ? SeccompRole::io_loop_snapshot : SeccompRole::io_loop;
    if (no_jail_)
        spdlog::warn("--no-jail: the VMM runs without its jail, seccomp filters and cgroup limits; use it only to debug");
    config.kernel_path = kernel_.empty() ? default_guest_file("vmlinux") : kernel_;
    config.rootfs_path = rootfs_.empty() ? default_guest_file("rootfs.ext4") : rootfs_;
    if (!template_.empty())
        check_template_name(template_);
    if (uses_template()) {
        for (const char* flag : {"--rootfs", "--snapshot"})
            if (given(flag))
                throw Error(fmt::format("--template and {} contradict each other: a template has its own", flag));
        const ResolvedTemplate& resolved = resolved_template();
        config.rootfs_path = resolved.rootfs;
        config.rootfs_layer = resolved.layer;
        if (!given("--cpus"))
            cpus_ = resolved.cpus;
        if (!given("--mem"))
            mem_mib_ = resolved.mem_mib;
    }
    require_readable_file(config.kernel_path, "kernel", "--kernel");
    require_readable_file(*config.rootfs_path, "root filesystem", "--rootfs");

    // The upper bound depends on KVM and is checked where the VM is built.
    if (cpus_ == 0)
        throw Error("--cpus 0 is out of range: a VM needs at least one vCPU");
    config.vcpus = cpus_;

    const uint64_t host_mib = host_ram_mib();
    if (mem_mib_ == 0 || mem_mib_ > host_mib)
        throw Error(fmt::format("--mem {} MiB is out of range: this host has {} MiB of RAM", mem_mib_,
                                host_mib));
    config.mem_mib = mem_mib_;
    const char* tmpdir = std::getenv("TMPDIR");
    config.overlay_dir = tmpdir && *tmpdir ? tmpdir : "/var/tmp";
    if (disk_mib_ != 0) {
        // Checked before multiplying: a wrapped product would be some other, valid-looking size.
        if (disk_mib_ > max_disk_mib)
            throw Error(fmt::format("--disk-size {} MiB is out of range: at most {} MiB", disk_mib_, max_disk_mib));
        config.disk_bytes = disk_mib_ * layout::mib;
        check_disk_size(config);
    }
    config.guest_pids_max = guest_pids_;
    config.extra_cmdline = cmdline_;
    config.init_cmd = init_cmd_;
    config.serve_agent_only = role_ != VmRole::boot;
    if (!vsock_uds_.empty())
        config.vsock_uds = vsock_uds_;

    if (!console_.empty() && console_ != "-") {
        const auto dir = std::filesystem::path(console_).parent_path();
        const std::string where = dir.empty() ? "." : dir.string();
        if (::access(where.c_str(), W_OK) != 0)
            throw_errno(fmt::format("cannot write console file '{}' (--console) in '{}'", console_, where));
    }
    return config;
}

const ResolvedTemplate& VmOptions::resolved_template() const
{
    if (!resolved_template_)
        resolved_template_ = resolve_template(template_, template_store_);
    return *resolved_template_;
}

std::optional<std::string> VmOptions::snapshot_dir() const
{
    if (role_ != VmRole::agent)
        return std::nullopt;
    if (!snapshot_.empty()) {
        if (cold_)
            throw Error("--snapshot and --cold contradict each other");
        return snapshot_;
    }
    for (const char* flag : {"--cold", "--kernel", "--rootfs", "--cmdline", "--cpus", "--mem", "--disk-size"})
        if (command_->count(flag) > 0)
            return std::nullopt;
    if (uses_template()) {
        const ResolvedTemplate& resolved = resolved_template();
        if (!resolved.snapshot)
            spdlog::warn("template '{}' is not baked (agentvm template bake {}): booting it cold", template_, template_);
        return resolved.snapshot;
    }
    const std::string baked = default_guest_file("snapshot");
    if (!std::filesystem::exists(baked + "/manifest.json"))
        return std::nullopt;
    return baked;
}

int VmOptions::open_console()
{
    if (console_.empty())
        return -1;
    if (console_ == "-")
        return STDERR_FILENO;
    struct stat st {};
    console_created_ = ::stat(console_.c_str(), &st) != 0;
    console_fd_ = Fd(::open(console_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!console_fd_)
        throw_errno(fmt::format("cannot open console file '{}' (--console)", console_));
    return console_fd_.get();
}

void VmOptions::apply_limits(const VmConfig& config) const
{
    if (!cgroup_)
        return;
    CgroupLimits limits;
    limits.cpu_cores = cpu_quota_ < 0 ? static_cast<double>(config.vcpus) : cpu_quota_;
    const uint64_t floor_mib = config.mem_mib + vmm_minimum_overhead_mib;
    if (vmm_mem_mib_ > 0 && static_cast<uint64_t>(vmm_mem_mib_) < floor_mib)
        throw Error(fmt::format("--vmm-mem {} MiB is too little: the guest's {} MiB of memory and the VMM's own "
                                "{} MiB need at least {} MiB",
                                vmm_mem_mib_, config.mem_mib, vmm_minimum_overhead_mib, floor_mib));
    uint64_t mem_mib = static_cast<uint64_t>(vmm_mem_mib_);
    if (vmm_mem_mib_ < 0) {
        mem_mib = config.mem_mib + vmm_overhead_mib;
        // An overlay in tmpfs is memory the cgroup is charged for and cannot write back: a guest
        // filling its disk would hit the memory limit instead of ENOSPC. It can grow to the disk.
        if (config.rootfs_path && memory_backed(config.overlay_dir))
            mem_mib += (disk_size(config) + layout::mib - 1) / layout::mib;
    }
    limits.memory_bytes = mem_mib * layout::mib;
    limits.max_pids = vmm_max_tasks;
    limits.cpu_weight = cpu_weight_;
    cgroup_->limit(limits);
}

JailSpec VmOptions::jail_spec(const VmConfig& config) const
{
    JailSpec spec;
    spec.dirs = kept_dirs_;
    if (config.vsock_uds) {
        // The listening socket is removed at exit, and the guest's connections to host port P
        // go to <path>_P: the VMM keeps the socket's directory, writable.
        const auto dir = std::filesystem::absolute(*config.vsock_uds).parent_path();
        spec.dirs.push_back({dir.string(), true});
    }
    // The largest file the VMM writes is the size of guest memory (a snapshot's) or of the disk
    // (its overlay, a snapshot's copy); the console log is held to the same.
    uint64_t largest = config.mem_mib * layout::mib;
    if (config.rootfs_path)
        largest = std::max(largest, disk_size(config));
    spec.max_file_bytes = largest + file_size_slack;
    return spec;
}

std::optional<std::chrono::milliseconds> VmOptions::episode_timeout() const
{
    if (role_ != VmRole::agent || episode_timeout_s_ == 0)
        return std::nullopt;
    return seconds_to_ms(episode_timeout_s_);
}

void VmOptions::discard_console()
{
    console_fd_.reset();
    if (console_created_)
        ::unlink(console_.c_str());
}

} // namespace agentvm
