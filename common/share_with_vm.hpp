// How a directory or socket of the host is opened to one VMM that runs as its own gid (vmm/
// jail.hpp's JailIdentity): the file keeps its owner and gets that group and a mode. serve
// shares each VM's outbox, vsock directory and egress socket so (service/vm_users/), and
// `agentvm run --jail-uid` its private vsock directory and egress socket (cli/egress_host).
#pragma once

#include <sys/types.h>

#include <string>

namespace agentvm {

// Gives `path` the group `gid` and `mode`. Throws Error.
void share_with_vm(const std::string& path, gid_t gid, mode_t mode);

} // namespace agentvm
