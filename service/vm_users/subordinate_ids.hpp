// /etc/subuid and /etc/subgid (subuid(5)) against serve's --jail-uid-range: an id delegated
// there to a user's rootless containers (newuidmap maps it into their user namespaces) must not
// be a VMM's as well, or a process in such a container would own that VM's files.
#pragma once

#include <string>

#include "service/vm_users/jail_ids.hpp"

namespace agentvm {

// Throws Error naming the file, line and owner of the first delegation in `path`
// (OWNER:FIRST:COUNT a line) that overlaps `range`. A missing file delegates nothing; a line
// that is not OWNER:FIRST:COUNT is skipped, as shadow-utils skips it; a file past 16 MiB is
// refused, not read in part.
void check_no_subordinate_ids_in(const JailIdRange& range, const std::string& path);

} // namespace agentvm
