// Per-thread seccomp-bpf allow-lists (libseccomp).
//
// A vCPU thread runs the guest and, on each exit, the device-register emulation a hostile
// guest drives directly: the code most exposed to it. It needs a handful of system calls
// (KVM_RUN and the vCPU state ioctls, futexes, eventfd and console writes, memory for
// malloc), so it gets exactly those. Any other call is trapped: a SIGSYS handler writes one
// line naming the thread and the call to stderr and ends the process with status 128+SIGSYS
// (159), as no VM may go on running on a thread that asked for what it never needs.
//
// The filter binds the calling thread (and threads it creates) only, and sets no_new_privs.
#pragma once

namespace agentvm {

enum class SeccompRole {
    vcpu,
};

// Installs the SIGSYS reporter (once per process) and the role's filter on this thread.
// Throws Error when the kernel refuses the filter.
void install_seccomp(SeccompRole role);

} // namespace agentvm
