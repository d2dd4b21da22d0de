#include "common/error.hpp"

#include <cerrno>
#include <cstring>

namespace agentvm {

void throw_errno(std::string_view what, int err)
{
    throw Error(std::string(what) + ": " + std::strerror(err));
}

void throw_errno(std::string_view what)
{
    throw_errno(what, errno);
}

} // namespace agentvm
