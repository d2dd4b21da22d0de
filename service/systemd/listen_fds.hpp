// systemd's socket activation (sd_listen_fds(3)), without libsystemd: a service started for a
// .socket unit inherits its listening sockets as descriptors 3, 4, ... with $LISTEN_PID (the
// process meant), $LISTEN_FDS (how many) and $LISTEN_FDNAMES (their FileDescriptorName=s,
// ':'-separated). serve takes each as an HTTP listener, beside those --listen makes.
#pragma once

#include <string>
#include <vector>

#include "service/listen_spec.hpp"

namespace agentvm {

struct InheritedSocket {
    std::string name;  // from LISTEN_FDNAMES; systemd's default is the socket unit's name
    ListenSpec spec;   // what it is bound to (inherited_fd set)
};

// The sockets passed to this process, each checked to be a listening stream socket (Unix, IPv4
// or IPv6), made close-on-exec and non-blocking; none when $LISTEN_PID is unset or names
// another process (the variables were meant for a parent). The variables are unset, so that no
// child takes them as its own. Throws Error naming the variable or descriptor at fault.
std::vector<InheritedSocket> take_inherited_sockets();

} // namespace agentvm
