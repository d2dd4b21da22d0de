#include <fmt/format.h>

#include "protocol/cmdline.hpp"
#include "common/base64.hpp"
#include "vmm/vm_config.hpp"

namespace agentvm {

std::string guest_cmdline(const VmConfig& config, const std::string& device_params)
{
    // reboot=t: a guest reboot or power-off becomes a triple fault, which KVM reports as a
    // shutdown exit (there is no ACPI to power off through). panic=-1 turns a panic into the
    // same exit at once instead of hanging. quiet: every console byte costs a VM exit.
    std::string line = "console=ttyS0 reboot=t panic=-1 quiet";
    if (config.rootfs_path)
        line += " root=/dev/vda rw rootfstype=ext4 init=/sbin/agentvm-init";
    if (!device_params.empty())
        line += " " + device_params;
    if (config.init_cmd)
        line += " agentvm.init_cmd=" + base64_encode(*config.init_cmd);
    if (config.serve_agent_only)
        line += " agentvm.serve";
    if (config.rootfs_path && config.guest_pids_max != default_pids_max)
        line += fmt::format(" {}={}", pids_max_param, config.guest_pids_max);
    if (!config.extra_cmdline.empty())
        line += " " + config.extra_cmdline;
    return line;
}

} // namespace agentvm
