#include <array>
#include <string_view>

#include "vmm/vm_config.hpp"

namespace agentvm {
namespace {

// Base64 (RFC 4648, padded): the kernel command line cannot carry quotes, spaces or newlines
// inside one parameter, and the user's command may have all three.
std::string base64_encode(std::string_view in)
{
    static constexpr std::string_view alphabet =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    out.reserve((in.size() + 2) / 3 * 4);
    size_t i = 0;
    for (; i + 3 <= in.size(); i += 3) {
        const uint32_t v = (uint32_t{static_cast<uint8_t>(in[i])} << 16) |
                           (uint32_t{static_cast<uint8_t>(in[i + 1])} << 8) |
                           uint32_t{static_cast<uint8_t>(in[i + 2])};
        for (int shift = 18; shift >= 0; shift -= 6)
            out += alphabet[(v >> shift) & 0x3f];
    }
    const size_t rest = in.size() - i;
    if (rest > 0) {
        uint32_t v = uint32_t{static_cast<uint8_t>(in[i])} << 16;
        if (rest == 2)
            v |= uint32_t{static_cast<uint8_t>(in[i + 1])} << 8;
        out += alphabet[(v >> 18) & 0x3f];
        out += alphabet[(v >> 12) & 0x3f];
        out += rest == 2 ? alphabet[(v >> 6) & 0x3f] : '=';
        out += '=';
    }
    return out;
}

} // namespace

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
    if (!config.extra_cmdline.empty())
        line += " " + config.extra_cmdline;
    return line;
}

} // namespace agentvm
