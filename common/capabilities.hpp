// Which capabilities this process holds in its effective set, for the checks that name what
// is missing before a privileged step fails halfway (the VMM's jail, serve's VM users).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace agentvm {

struct Capability {
    int number;        // CAP_SYS_ADMIN, ... (<linux/capability.h>)
    const char* name;  // "CAP_SYS_ADMIN"
};

// The names of those of `wanted` this process does not hold, effective. Throws Error when the
// capabilities cannot be read.
std::vector<std::string> missing_capabilities(const std::vector<Capability>& wanted);

} // namespace agentvm
