// What a user asks of one VM. Plain data, validated by the CLI and by Vm's constructor.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "protocol/cmdline.hpp"
#include "vmm/seccomp.hpp"

namespace agentvm {

// A read-only file of the root disk's size holding these byte ranges [offset, offset+length)
// over the base image: a template's own blocks (templates/image_delta.hpp).
struct DiskLayer {
    std::string path;
    std::vector<std::pair<uint64_t, uint64_t>> byte_ranges;
};

struct VmConfig {
    std::string kernel_path;
    std::optional<std::string> rootfs_path;  // none: no disk (tiny test guests)
    // Read when booting. A restore ignores it: the snapshot's disk holds these blocks.
    std::optional<DiskLayer> rootfs_layer;
    // The root disk's size in bytes; 0: the image's. Larger: the guest grows its filesystem at boot.
    uint64_t disk_bytes = 0;
    // At most this many processes and threads in the guest's tool calls at once.
    uint32_t guest_pids_max = default_pids_max;
    uint32_t vcpus = 1;
    uint64_t mem_mib = 512;
    std::string extra_cmdline;                // appended after agentvm's own parameters
    std::optional<std::string> init_cmd;      // run by the guest init via /bin/sh -c
    // No init command and no console shell: the guest serves tool calls until the host
    // ends the VM (agentvm run and episode).
    bool serve_agent_only = false;
    int console_fd = -1;                      // serial output goes here (not owned); -1 drops it
    std::string overlay_dir;                  // where the disk's copy-on-write overlay lives
    std::optional<std::string> vsock_uds;     // host end of the guest's vsock (hybrid convention)
    // The VM may be paused for live snapshots (Vm::pause): a restored one opens
    // /proc/self/pagemap before the process is jailed, to find the pages it wrote.
    bool live_snapshots = false;
    bool jail = true;                         // false: no seccomp filters (--no-jail, debugging)
    // The thread that calls Vm::run() is filtered too, once the vCPU threads have started: for
    // a process that does nothing but run this VM (the agentvm commands), not for tests.
    std::optional<SeccompRole> run_thread_filter;
};

// The kernel command line agentvm gives its guests, before the user's extra parameters.
std::string guest_cmdline(const VmConfig& config, const std::string& device_params);

} // namespace agentvm
