#include "common/share_with_vm.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "common/error.hpp"

namespace agentvm {

void share_with_vm(const std::string& path, gid_t gid, mode_t mode)
{
    if (::chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0)
        throw_errno(fmt::format("giving '{}' to its VM's group {}", path, gid));
    if (::chmod(path.c_str(), mode) != 0)
        throw_errno(fmt::format("setting the mode of '{}' for its VM", path));
}

} // namespace agentvm
