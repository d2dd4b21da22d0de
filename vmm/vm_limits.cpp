#include "vmm/vm_limits.hpp"

#include <sys/sysinfo.h>

#include <algorithm>

#include "common/error.hpp"
#include "core/layout.hpp"
#include "vmm/mptable.hpp"

namespace agentvm {

uint32_t vcpu_limit(const Kvm& kvm)
{
    return std::min(kvm.max_vcpus(), mptable_max_vcpus);
}

uint64_t host_ram_mib()
{
    struct sysinfo info {};
    if (::sysinfo(&info) != 0)
        throw_errno("sysinfo");
    return uint64_t{info.totalram} * info.mem_unit / layout::mib;
}

} // namespace agentvm
