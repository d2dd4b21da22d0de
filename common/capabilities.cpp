#include "common/capabilities.hpp"

#include <linux/capability.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/error.hpp"

namespace agentvm {

std::vector<std::string> missing_capabilities(const std::vector<Capability>& wanted)
{
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct held[_LINUX_CAPABILITY_U32S_3] = {};
    if (::syscall(SYS_capget, &header, held) != 0)
        throw_errno("reading this process's capabilities");
    std::vector<std::string> missing;
    for (const Capability& cap : wanted)
        if ((held[CAP_TO_INDEX(cap.number)].effective & CAP_TO_MASK(cap.number)) == 0)
            missing.emplace_back(cap.name);
    return missing;
}

} // namespace agentvm
