// `agentvm port-forward GUEST_PORT`: a local TCP port (or Unix socket) forwarded to a TCP port
// in a guest, which has no network device: through its VM's --vsock-uds socket, or through
// serve's TCP upgrade of a sandbox (docs/cli.md). The work is in cli/port_forward/.
#pragma once

#include "cli/subcommand.hpp"

namespace agentvm {

Subcommand add_port_forward_command(CLI::App& app);

} // namespace agentvm
