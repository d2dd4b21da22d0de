#include "common/pipe.hpp"

#include <fcntl.h>
#include <unistd.h>

#include "common/error.hpp"

namespace agentvm {

Pipe make_pipe()
{
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0)
        throw_errno("pipe2");
    return {Fd(fds[0]), Fd(fds[1])};
}

} // namespace agentvm
