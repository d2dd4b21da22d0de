// What every VM-starting command (boot, run, episode, snapshot bake) asks of its VM, and
// its validation into a VmConfig, with the defaults and what follows from it: the snapshot,
// the console, the cgroup's limits, the jail. The flags that fill it are cli/vm_flags.hpp;
// each bad value is one clear line naming its flag.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "episode/template_options.hpp"
#include "vmm/cgroup.hpp"
#include "common/fd.hpp"
#include "vmm/jail.hpp"
#include "vmm/vm_config.hpp"

namespace agentvm {

// boot: the guest runs --init-cmd or a console shell, and the console goes to stderr.
// agent: the guest only serves tool calls (run, episode), and the console is dropped unless
// --console asks for it, so the command's own output stays clean; may restore a snapshot.
// bake: as agent, but always boots (it makes the snapshot).
enum class VmRole { boot, agent, bake };

// Host memory a VMM needs beyond guest memory: its own code and heap, device buffers, io_uring,
// the page cache of its disk and snapshot files. The default limit leaves room; below the
// minimum a VMM cannot work.
inline constexpr uint64_t vmm_overhead_mib = 256;
inline constexpr uint64_t vmm_minimum_overhead_mib = 64;
// cgroup v2's cpu.max quota for a core count: ample for any host, far inside its range.
inline constexpr double max_cpu_quota_cores = 4096;

// What the user asked for, each field named after its flag; unset ones keep these defaults.
struct VmRequest {
    std::string kernel;
    std::string rootfs;
    uint32_t cpus = 1;
    uint64_t mem_mib = 512;
    uint64_t disk_mib = 0;         // unset: the rootfs image's size
    uint32_t guest_pids = default_pids_max;
    std::string cmdline;
    std::optional<std::string> init_cmd;
    std::string console;           // boot: "-", the others: "" (dropped)
    std::string vsock_uds;
    std::string snapshot;
    std::string template_name;
    std::string template_store;
    bool cold = false;
    bool no_jail = false;
    // The VMM's own unprivileged uid and gid in its jail (serve gives each VM one); unset: it
    // keeps the uid it was started with. The gid defaults to the uid.
    std::optional<uint32_t> jail_uid;
    std::optional<uint32_t> jail_gid;
    double cpu_quota = -1;         // unset: one core per vCPU
    unsigned cpu_weight = 0;       // unset: the cgroup's default
    int64_t vmm_mem_mib = -1;      // unset: guest memory + vmm_overhead_mib
    double episode_timeout_s = 3600;
    // The flags the user gave ("--cpus"), so that a snapshot's or a template's own values
    // yield only to those.
    std::set<std::string> given;
};

class VmOptions {
public:
    explicit VmOptions(VmRole role);
    VmRole role() const { return role_; }
    // Filled from the command line before anything below is asked.
    VmRequest& request() { return request_; }

    // Checks files, sizes and counts against this host. Throws Error. The console is left
    // unset: it is opened last, once nothing else can fail first.
    VmConfig resolve();
    // agent role: the snapshot to restore from: --snapshot, or --template's once baked, or else
    // the default snapshot (episode/guest_location.hpp) when it exists; none when
    // something asks for a cold boot (--cold, or --kernel, --rootfs, --cmdline, --cpus or --mem,
    // which a snapshot has fixed).
    std::optional<std::string> snapshot_dir() const;
    // agent role: whether the default snapshot is the one to restore (nothing named another
    // or asked for a cold boot), whether or not it has been baked.
    bool uses_default_snapshot() const;
    // Whether --snapshot (or --template) named the snapshot (rather than set-up's default being used).
    bool snapshot_given() const { return !request_.snapshot.empty() || uses_template(); }
    // Whether --template names a template other than set-up's default guest.
    bool uses_template() const { return !request_.template_name.empty() && request_.template_name != "default"; }
    // Whether the user gave `flag` (so a snapshot's own value must match it).
    bool given(const std::string& flag) const { return request_.given.contains(flag); }

    // Opens --console (a file, or stderr for "-") and returns the fd to write the console to,
    // or -1 when it is dropped.
    int open_console();
    // Removes the console file again if open_console() created it and the VM never ran.
    void discard_console();

    // The jail and the limits (SECURITY.md). Without --no-jail the command's VM runs in a
    // jailed child process (run_jailed); these are for that child.
    bool jailed() const { return !request_.no_jail; }
    // The identity the VMM takes in its jail, if any (--jail-uid, --jail-gid).
    std::optional<JailIdentity> jail_identity() const;
    // The cgroup the supervisor made for this VMM, or none: --cpu-quota 0 --vmm-mem 0.
    bool wants_cgroup() const
    {
        return request_.cpu_quota != 0 || request_.vmm_mem_mib != 0 || request_.cpu_weight != 0;
    }
    void attach_cgroup(VmCgroup* cgroup) { cgroup_ = cgroup; }
    // Once the VM's vCPU count and memory size are known (a snapshot may set them): the
    // cgroup limits. Throws Error for a --vmm-mem too small for the guest.
    void apply_limits(const VmConfig& config) const;
    // Waits until the supervisor has moved this process into its cgroup (VmCgroup::wait_joined).
    void wait_for_cgroup()
    {
        if (cgroup_)
            cgroup_->wait_joined();
    }
    // agent role (episode --snapshot-dir): the VM may take live snapshots into `dir`, which
    // stays writable in the jail.
    void allow_live_snapshots(std::string dir)
    {
        live_snapshots_ = true;
        keep_writable_dir(std::move(dir));
    }
    // A directory the VMM must still write in by name after it is jailed (a snapshot's).
    void keep_writable_dir(std::string dir) { kept_dirs_.push_back({std::move(dir), true}); }
    JailSpec jail_spec(const VmConfig& config) const;
    // agent role: how long the whole episode may last (--episode-timeout), counted from start.
    std::optional<std::chrono::milliseconds> episode_timeout() const;

private:
    const ResolvedTemplate& resolved_template() const;
    // Whether a flag asks for a cold boot, or fixes what a snapshot has fixed.
    bool cold_boot_asked() const;

    VmRole role_;
    VmRequest request_;
    // --template's manifest, read once for both the config and the snapshot.
    mutable std::optional<ResolvedTemplate> resolved_template_;
    bool live_snapshots_ = false;
    VmCgroup* cgroup_ = nullptr;
    std::vector<JailDir> kept_dirs_;
    Fd console_fd_;
    bool console_created_ = false;
};

// The running agentvm binary's path. Throws Error.
std::string agentvm_binary();
// A file of the default guest (episode/guest_location.hpp). Throws Error.
std::string default_guest_file(const std::string& name);

} // namespace agentvm
