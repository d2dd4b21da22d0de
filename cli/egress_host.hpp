// `agentvm run` and `agentvm episode` with --egress-allow: the host end of the guest's egress
// proxy (service/egress/egress_proxy.hpp), as serve runs one per sandbox. It runs in a process
// of its own, forked before the VM starts and so outside the VMM's jail (it resolves names and
// connects, which the jail forbids), dying with this one; it logs every connection on stderr
// at debug level (--log-level debug), since the tool shows a refusal itself. The VM's end of
// vsock must be a Unix socket for the guest to reach it: without --vsock-uds, one is made in a
// private temporary directory.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <optional>

#include <memory>
#include <string>
#include <vector>

#include "service/egress/egress_proxy.hpp"
#include "vmm/jail.hpp"

namespace CLI {
class App;
}

namespace agentvm {

struct EgressFlags {
    std::vector<std::string> allow;
    std::vector<std::string> deny;
    EgressLimits limits;
};

// --egress-allow, --egress-deny, --egress-max-connections, --egress-max-bytes.
void add_egress_flags(CLI::App& command, EgressFlags& flags);

class EgressHost {
public:
    // Checks the rules (Error naming the bad one), forks the proxy process and waits until it
    // listens; sets `vsock_uds` when it is empty. Call while this process has no other thread.
    // Returns null when `flags` allow nothing. `vm_identity`: the VMM's own (--jail-uid), whose
    // gid is given the private directory and the proxy's socket.
    static std::unique_ptr<EgressHost> start(const EgressFlags& flags, std::string& vsock_uds,
                                             const std::optional<JailIdentity>& vm_identity);
    // Ends the proxy process and removes what it made.
    ~EgressHost();
    EgressHost(const EgressHost&) = delete;
    EgressHost& operator=(const EgressHost&) = delete;

private:
    EgressHost() = default;
    pid_t owner_ = ::getpid();  // the VMM's child process shares this object, and leaves it be
    pid_t pid_ = -1;
    std::string socket_;
    std::string temporary_dir_;  // made here, removed at the end
};

} // namespace agentvm
