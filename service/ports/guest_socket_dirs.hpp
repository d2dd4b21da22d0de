// Where serve's VMs put the Unix socket of their end of vsock (`agentvm episode
// --vsock-uds`): one private directory per serve, made at start and removed at exit, and in it
// one per VM, the only directory of serve's that the VM's jail keeps (writable: the VMM removes
// its socket at exit), so a VMM a guest took over reaches no other VM's socket.
#pragma once

#include <string>

namespace agentvm {

class GuestSocketDirs {
public:
    // Under $TMPDIR (else /tmp). Throws Error if it cannot be made, or if a socket's path
    // there would be too long for a Unix socket.
    GuestSocketDirs();
    ~GuestSocketDirs();
    GuestSocketDirs(const GuestSocketDirs&) = delete;
    GuestSocketDirs& operator=(const GuestSocketDirs&) = delete;

    // A new VM's directory; its socket is socket_in(dir). Throws Error.
    std::string make();
    static std::string socket_in(const std::string& dir) { return dir + "/vsock"; }
    // Removes a VM's directory (once the VM has ended); anything outside the root is left alone.
    void remove(const std::string& dir);

private:
    std::string root_;
};

} // namespace agentvm
