#include <CLI/CLI.hpp>

#include "cli/vm_flags.hpp"

#include <fmt/format.h>

#include "cli/seconds_option.hpp"

namespace agentvm {

void add_vm_flags(CLI::App& command, VmOptions& options)
{
    VmRequest& request = options.request();
    const VmRole role = options.role();
    command.add_option("--kernel", request.kernel, "guest kernel: vmlinux ELF or bzImage (default: the one set-up built)");
    command.add_option("--rootfs", request.rootfs, "root filesystem image, opened read-only (default: the one set-up built)");
    command.add_option("--cpus", request.cpus, "number of vCPUs")->capture_default_str();
    command.add_option("--mem", request.mem_mib, "guest memory in MiB")->capture_default_str();
    command.add_option("--disk-size", request.disk_mib,
                       "root disk size in MiB, at least the rootfs image's: the guest's filesystem grows to fill "
                       "it at boot, and its writes meet ENOSPC there (default: the image's size)")
        ->check(CLI::PositiveNumber);
    command.add_option("--guest-pids", request.guest_pids,
                       "processes and threads the guest's tool calls may have at once")
        ->capture_default_str()
        ->check(CLI::Range(uint32_t{1}, max_pids_max));
    command.add_option("--cmdline", request.cmdline, "extra kernel command-line parameters");
    if (role == VmRole::boot)
        command.add_option("--init-cmd", request.init_cmd, "command the guest init runs with /bin/sh -c, then powers off");
    command.add_option("--vsock-uds", request.vsock_uds,
                       "Unix socket for the guest's vsock: connect and write 'CONNECT <port>\\n' to reach a "
                       "guest port; the guest reaches host port P at <path>_P");
    auto* console = command.add_option(
        "--console", request.console, "where the guest serial console goes: a file path, or - for stderr");
    if (role == VmRole::agent) {
        command.add_option("--snapshot", request.snapshot,
                           "restore from this snapshot (agentvm snapshot bake) instead of booting");
        command.add_flag("--cold", request.cold, "boot, even where set-up's default snapshot exists");
        command.add_option("--template", request.template_name,
                           "run template NAME (agentvm template build): its image, restored from its snapshot once "
                           "baked; 'default' is set-up's own guest");
    }
    if (role == VmRole::bake)
        command.add_option("--template", request.template_name,
                           "boot template NAME's image (agentvm template build): its shared base and its own "
                           "blocks over it (agentvm template bake runs this)");
    if (role == VmRole::agent || role == VmRole::bake)
        command.add_option("--template-store", request.template_store,
                           "where templates are (default: AGENTVM_TEMPLATES, else /var/lib/agentvm/templates)");
    command.add_flag("--no-jail", request.no_jail,
                     "debugging only: run the VMM without its jail, seccomp filters and cgroup limits "
                     "(a hostile guest then meets fewer walls)");
    command.add_option("--jail-uid", request.jail_uid,
                       "the unprivileged uid the VMM becomes in its jail (default: it keeps agentvm's); "
                       "directories it writes (--vsock-uds's, a snapshot's) must be its group's");
    command.add_option("--jail-gid", request.jail_gid, "the VMM's gid in its jail (default: --jail-uid's number)");
    command.add_option("--cpu-quota", request.cpu_quota,
                       "host CPU time the VMM may use, in cores (default: one per vCPU; 0: no quota)")
        ->check(bounded_number(max_cpu_quota_cores, "cores"));
    command.add_option("--cpu-weight", request.cpu_weight,
                       "the VMM's share of contended host CPU against other VMMs, 1-10000 (cgroup cpu.weight; "
                       "default 100); agentvm serve starts its pool's VMs low")
        ->check(CLI::Range(1u, 10000u));
    command.add_option("--vmm-mem", request.vmm_mem_mib,
                       fmt::format("host memory the VMM may use in MiB, guest memory included (default: --mem + {}, "
                                   "plus the disk's size when TMPDIR is tmpfs; 0: no limit)",
                                   vmm_overhead_mib))
        ->check(CLI::NonNegativeNumber);
    if (role == VmRole::agent)
        command.add_option("--episode-timeout", request.episode_timeout_s,
                           "seconds the whole episode may last; then every pending call fails and the VM stops "
                           "(0: no limit)")
            ->capture_default_str()
            ->check(seconds_option(true));
    if (role == VmRole::boot)
        console->capture_default_str();
    else
        console->description(console->get_description() + " (default: dropped)");

    // A snapshot's or a template's own vCPUs and memory yield only to flags the user gave,
    // whatever value they gave.
    command.final_callback([&command, &request] {
        for (const CLI::Option* option : command.get_options())
            if (option->count() > 0)
                for (const std::string& name : option->get_lnames())
                    request.given.insert("--" + name);
    });
}

} // namespace agentvm
