// Where agentvm finds its default guest (kernel, root filesystem, the guest's binaries) and
// its default snapshot when no flag names them, so that the same binary works from a checkout
// and from an install. Flags (--kernel, --rootfs, --snapshot) override single files and are
// VmOptions' business; this decides only the default, in this order:
//   1. $AGENTVM_GUEST_DIR: the guest files there, the snapshot in its snapshot/;
//   2. the checkout's build/guest/ when the binary runs from a meson build directory (one
//      holding build.ninja), or a guest/ holding vmlinux beside the binary (a build's binary and
//      guest copied together), the snapshot in its snapshot/, as set-up bakes it;
//   3. the installed <prefix>/lib/agentvm/, the snapshot in <localstatedir>/lib/agentvm/snapshot:
//      a snapshot belongs to the host's CPU and kernel, so the package cannot ship one.
#pragma once

#include <filesystem>
#include <functional>
#include <string>

namespace agentvm {

enum class GuestSource { environment, checkout, installed };

// What the search looks at; default_guest_search() fills it for this process.
struct GuestSearch {
    std::string env_dir;                      // $AGENTVM_GUEST_DIR; empty when unset
    std::filesystem::path binary_dir;         // where the running agentvm is
    std::filesystem::path installed_dir;      // <prefix>/lib/agentvm, fixed at build time
    std::filesystem::path installed_snapshot; // <localstatedir>/lib/agentvm/snapshot, fixed at build time
};

struct GuestLocation {
    GuestSource source;
    std::filesystem::path dir;       // vmlinux, rootfs.ext4, agentvm-init, agent/agentvm-agent, apt_mirror.sh
    std::filesystem::path snapshot;  // the default snapshot's directory (it may not exist yet)
};

// The default guest for `search`; `is_file` tells whether a path exists (a parameter so that
// tests decide what the file system holds).
GuestLocation locate_guest(const GuestSearch& search,
                           const std::function<bool(const std::filesystem::path&)>& is_file);

// This process's search: the environment, /proc/self/exe and the build's install paths. Throws Error.
GuestSearch default_guest_search();
// locate_guest(default_guest_search()) on the real file system. Throws Error.
GuestLocation default_guest();

// "$AGENTVM_GUEST_DIR", "the checkout's build directory", "the installed guest": for messages.
const char* describe(GuestSource source);

} // namespace agentvm
