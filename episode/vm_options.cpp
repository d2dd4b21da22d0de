#include "episode/vm_options.hpp"

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

#include "episode/guest_location.hpp"
#include "episode/seconds.hpp"
#include "episode/template_options.hpp"
#include "protocol/cmdline.hpp"
#include "common/error.hpp"
#include "core/layout.hpp"
#include "devices/cow_disk.hpp"
#include "templates/template_store.hpp"
#include "vmm/vm_limits.hpp"

namespace agentvm {

namespace {

// Threads of one VMM: a vCPU each, the I/O loop, and io_uring's workers for blocking I/O.
constexpr uint64_t vmm_max_tasks = 512;
constexpr uint64_t file_size_slack = 64 * layout::mib;
constexpr uint64_t max_disk_mib = CowDisk::max_capacity_bytes / layout::mib;

// origin: where the path came from, for the message.
void require_readable_file(const std::string& path, const char* what, const std::string& origin)
{
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
        throw_errno(fmt::format("{} '{}' ({})", what, path, origin));
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
    return (default_guest().dir / name).string();
}

VmOptions::VmOptions(VmRole role) : role_(role)
{
    if (role == VmRole::boot)
        request_.console = "-";
}

VmConfig VmOptions::resolve()
{
    VmConfig config;
    config.jail = !request_.no_jail;
    config.live_snapshots = live_snapshots_;
    config.run_thread_filter =
        role_ == VmRole::bake || live_snapshots_ ? SeccompRole::io_loop_snapshot : SeccompRole::io_loop;
    if (request_.no_jail)
        spdlog::warn("--no-jail: the VMM runs without its jail, seccomp filters and cgroup limits; use it only to debug");
    if (request_.no_jail && (request_.jail_uid || request_.jail_gid))
        throw Error("--jail-uid and --jail-gid are the jail's: they contradict --no-jail");
    if (request_.jail_gid && !request_.jail_uid)
        throw Error("--jail-gid needs --jail-uid: the VMM keeps its own uid otherwise");
    if (request_.jail_uid == 0u || request_.jail_gid == 0u)
        throw Error("--jail-uid and --jail-gid must not be 0 (root): leave them out to keep the uid agentvm runs as");
    // A default file that is missing is named with where it was looked for, not with a flag
    // the user never gave.
    const GuestLocation guest = default_guest();
    const auto default_origin = [&](const char* flag) {
        return fmt::format("the default, from {} {}; `agentvm doctor` checks the guest files, {} names another",
                           describe(guest.source), guest.dir.string(), flag);
    };
    config.kernel_path = request_.kernel.empty() ? (guest.dir / "vmlinux").string() : request_.kernel;
    config.rootfs_path = request_.rootfs.empty() ? (guest.dir / "rootfs.ext4").string() : request_.rootfs;
    if (!request_.template_name.empty())
        check_template_name(request_.template_name);
    if (uses_template()) {
        for (const char* flag : {"--rootfs", "--snapshot"})
            if (given(flag))
                throw Error(fmt::format("--template and {} contradict each other: a template has its own", flag));
        const ResolvedTemplate& resolved = resolved_template();
        config.rootfs_path = resolved.rootfs;
        config.rootfs_layer = resolved.layer;
        if (!given("--cpus"))
            request_.cpus = resolved.cpus;
        if (!given("--mem"))
            request_.mem_mib = resolved.mem_mib;
    }
    require_readable_file(config.kernel_path, "kernel",
                          request_.kernel.empty() ? default_origin("--kernel") : "set with --kernel");
    require_readable_file(*config.rootfs_path, "root filesystem",
                          request_.rootfs.empty() && !uses_template() ? default_origin("--rootfs")
                                                                      : "set with --rootfs");

    // The upper bound depends on KVM and is checked where the VM is built.
    if (request_.cpus == 0)
        throw Error("--cpus 0 is out of range: a VM needs at least one vCPU");
    config.vcpus = request_.cpus;

    const uint64_t host_mib = host_ram_mib();
    if (request_.mem_mib == 0 || request_.mem_mib > host_mib)
        throw Error(fmt::format("--mem {} MiB is out of range: this host has {} MiB of RAM", request_.mem_mib,
                                host_mib));
    config.mem_mib = request_.mem_mib;
    const char* tmpdir = std::getenv("TMPDIR");
    config.overlay_dir = tmpdir && *tmpdir ? tmpdir : "/var/tmp";
    if (request_.disk_mib != 0) {
        // Checked before multiplying: a wrapped product would be some other, valid-looking size.
        if (request_.disk_mib > max_disk_mib)
            throw Error(fmt::format("--disk-size {} MiB is out of range: at most {} MiB", request_.disk_mib,
                                    max_disk_mib));
        config.disk_bytes = request_.disk_mib * layout::mib;
        check_disk_size(config);
    }
    config.guest_pids_max = request_.guest_pids;
    config.extra_cmdline = request_.cmdline;
    config.init_cmd = request_.init_cmd;
    config.serve_agent_only = role_ != VmRole::boot;
    if (!request_.vsock_uds.empty())
        config.vsock_uds = request_.vsock_uds;

    if (!request_.console.empty() && request_.console != "-") {
        const auto dir = std::filesystem::path(request_.console).parent_path();
        const std::string where = dir.empty() ? "." : dir.string();
        if (::access(where.c_str(), W_OK) != 0)
            throw_errno(fmt::format("cannot write console file '{}' (--console) in '{}'", request_.console, where));
    }
    return config;
}

const ResolvedTemplate& VmOptions::resolved_template() const
{
    if (!resolved_template_)
        resolved_template_ = resolve_template(request_.template_name, request_.template_store);
    return *resolved_template_;
}

bool VmOptions::cold_boot_asked() const
{
    for (const char* flag : {"--cold", "--kernel", "--rootfs", "--cmdline", "--cpus", "--mem", "--disk-size"})
        if (given(flag))
            return true;
    return false;
}

bool VmOptions::uses_default_snapshot() const
{
    return role_ == VmRole::agent && request_.snapshot.empty() && !uses_template() && !cold_boot_asked();
}

std::optional<std::string> VmOptions::snapshot_dir() const
{
    if (role_ != VmRole::agent)
        return std::nullopt;
    if (!request_.snapshot.empty()) {
        if (request_.cold)
            throw Error("--snapshot and --cold contradict each other");
        return request_.snapshot;
    }
    if (cold_boot_asked())
        return std::nullopt;
    if (uses_template()) {
        const ResolvedTemplate& resolved = resolved_template();
        if (!resolved.snapshot)
            spdlog::warn("template '{}' is not baked (agentvm template bake {}): booting it cold",
                         request_.template_name, request_.template_name);
        return resolved.snapshot;
    }
    const std::string baked = default_guest().snapshot.string();
    if (!std::filesystem::exists(baked + "/manifest.json"))
        return std::nullopt;
    return baked;
}

int VmOptions::open_console()
{
    if (request_.console.empty())
        return -1;
    if (request_.console == "-")
        return STDERR_FILENO;
    struct stat st {};
    console_created_ = ::stat(request_.console.c_str(), &st) != 0;
    console_fd_ = Fd(::open(request_.console.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!console_fd_)
        throw_errno(fmt::format("cannot open console file '{}' (--console)", request_.console));
    return console_fd_.get();
}

void VmOptions::apply_limits(const VmConfig& config) const
{
    if (!cgroup_)
        return;
    CgroupLimits limits;
    limits.cpu_cores = request_.cpu_quota < 0 ? static_cast<double>(config.vcpus) : request_.cpu_quota;
    const uint64_t floor_mib = config.mem_mib + vmm_minimum_overhead_mib;
    if (request_.vmm_mem_mib > 0 && static_cast<uint64_t>(request_.vmm_mem_mib) < floor_mib)
        throw Error(fmt::format("--vmm-mem {} MiB is too little: the guest's {} MiB of memory and the VMM's own "
                                "{} MiB need at least {} MiB",
                                request_.vmm_mem_mib, config.mem_mib, vmm_minimum_overhead_mib, floor_mib));
    uint64_t mem_mib = static_cast<uint64_t>(request_.vmm_mem_mib);
    if (request_.vmm_mem_mib < 0) {
        mem_mib = config.mem_mib + vmm_overhead_mib;
        // An overlay in tmpfs is memory the cgroup is charged for and cannot write back: a guest
        // filling its disk would hit the memory limit instead of ENOSPC. It can grow to the disk.
        if (config.rootfs_path && memory_backed(config.overlay_dir))
            mem_mib += (disk_size(config) + layout::mib - 1) / layout::mib;
    }
    limits.memory_bytes = mem_mib * layout::mib;
    limits.max_pids = vmm_max_tasks;
    limits.cpu_weight = request_.cpu_weight;
    cgroup_->limit(limits);
}

std::optional<JailIdentity> VmOptions::jail_identity() const
{
    if (!request_.jail_uid)
        return std::nullopt;
    return JailIdentity{*request_.jail_uid, request_.jail_gid.value_or(*request_.jail_uid)};
}

JailSpec VmOptions::jail_spec(const VmConfig& config) const
{
    JailSpec spec;
    spec.dirs = kept_dirs_;
    spec.identity = jail_identity();
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
    if (role_ != VmRole::agent || request_.episode_timeout_s == 0)
        return std::nullopt;
    return seconds_to_ms(request_.episode_timeout_s);
}

void VmOptions::discard_console()
{
    console_fd_.reset();
    if (console_created_)
        ::unlink(request_.console.c_str());
}

} // namespace agentvm
