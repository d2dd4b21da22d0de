// The flags every VM-starting command shares (boot, run, episode), and their
// validation into a VmConfig. Each bad value is one clear line naming the flag.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "vmm/fd.hpp"
#include "vmm/vm_config.hpp"

namespace agentvm {

// boot: the guest runs --init-cmd or a console shell, and the console goes to stderr.
// agent: the guest only serves tool calls (run, episode), and the console is dropped unless
// --console asks for it, so the command's own output stays clean; may restore a snapshot.
// bake: as agent, but always boots (it makes the snapshot).
enum class VmRole { boot, agent, bake };

class VmOptions {
public:
    explicit VmOptions(VmRole role);
    void add_to(CLI::App& command);

    // Checks files, sizes and counts against this host. Throws Error. The console is left
    // unset: it is opened last, once nothing else can fail first.
    VmConfig resolve();
    // agent role: the snapshot to restore from: --snapshot, or else set-up's default snapshot
    // (<agentvm dir>/guest/snapshot) when it exists and nothing asks for a cold boot (--cold,
    // or --kernel, --rootfs, --cmdline, --cpus or --mem, which a snapshot has fixed).
    std::optional<std::string> snapshot_dir() const;
    // Whether --snapshot named the snapshot (rather than set-up's default being used).
    bool snapshot_given() const { return !snapshot_.empty(); }
    // Whether the user gave `flag` (so a snapshot's own value must match it).
    bool given(const char* flag) const { return command_ && command_->count(flag) > 0; }

    // Opens --console (a file, or stderr for "-") and returns the fd to write the console to,
    // or -1 when it is dropped.
    int open_console();
    // Removes the console file again if open_console() created it and the VM never ran.
    void discard_console();

private:
    VmRole role_;
    std::string kernel_;
    std::string rootfs_;
    uint32_t cpus_ = 1;
    uint64_t mem_mib_ = 512;
    std::string cmdline_;
    std::optional<std::string> init_cmd_;
    std::string console_;
    std::string vsock_uds_;
    std::string snapshot_;
    bool cold_ = false;
    bool no_jail_ = false;
    CLI::App* command_ = nullptr;
    Fd console_fd_;
    bool console_created_ = false;
};

// Where set-up puts the default guest: <directory of the agentvm binary>/guest/.
std::string default_guest_file(const std::string& name);

} // namespace agentvm
