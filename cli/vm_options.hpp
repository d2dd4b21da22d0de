// The flags every VM-starting command shares (boot today; run and episode next), and their
// validation into a VmConfig. Each bad value is one clear line naming the flag.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "vmm/fd.hpp"
#include "vmm/vm_config.hpp"

namespace agentvm {

class VmOptions {
public:
    void add_to(CLI::App& command);

    // Checks files, sizes and counts against this host; opens the console. Throws Error.
    VmConfig resolve();

private:
    std::string kernel_;
    std::string rootfs_;
    uint32_t cpus_ = 1;
    uint64_t mem_mib_ = 512;
    std::string cmdline_;
    std::optional<std::string> init_cmd_;
    std::string console_ = "-";
    Fd console_fd_;
};

// Where set-up puts the default guest: <directory of the agentvm binary>/guest/.
std::string default_guest_file(const std::string& name);

} // namespace agentvm
