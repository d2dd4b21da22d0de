// A pipe as two owned ends, both close-on-exec (a child gets only the ends it is handed).
#pragma once

#include "common/fd.hpp"

namespace agentvm {

struct Pipe {
    Fd read;
    Fd write;
};

// Throws Error ("pipe2: <strerror>").
Pipe make_pipe();

} // namespace agentvm
