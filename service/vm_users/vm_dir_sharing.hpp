// What serve shares with a VMM that runs as its own uid and gid (jail_ids.hpp), and takes back
// from it. A VM's writable directories (its snapshot outbox, its vsock socket's directory) stay
// serve's, with the VM's group and mode 0770, so that serve and that VM only may enter them;
// a socket serve listens on there for the VM (its egress proxy) gets the VM's group and 0660
// (common/share_with_vm.hpp). What the VMM writes (its live snapshots) serve takes back before it reads, moves or removes it:
// the whole tree becomes serve's, the top first, so the VM can change nothing in it after.
#pragma once

#include <string>

namespace agentvm {

// Makes `path` and everything below it this process's (its euid and egid), following no
// symbolic link. Nothing to do for a path that is gone. Throws Error naming the entry it
// could not take, or a tree deeper than a snapshot's.
void reclaim_tree(const std::string& path);

} // namespace agentvm
