// Per-thread seccomp-bpf allow-lists (libseccomp), one per kind of thread.
//
// A vCPU thread runs the guest and, on each exit, the device-register emulation a hostile
// guest drives directly: the code most exposed to it. It needs a handful of system calls
// (KVM_RUN, futexes, eventfd writes, memory for malloc), so it gets exactly
// those. The I/O loop thread (the one that called Vm::run) needs more: io_uring, timers,
// Unix sockets for the host's vsock side, signalling the vCPU threads; and, in a VM that is
// saved to a snapshot after it runs, creating the snapshot's files and the state ioctls.
// It gets no open() at all otherwise: every file a VM uses is open before it runs.
// Any other call is trapped: a SIGSYS handler writes one line naming the thread and the
// call to stderr and ends the process with status 128+SIGSYS (159), as no VM may go on
// running on a thread that asked for what it never needs.
//
// The filter binds the calling thread (and threads it creates afterwards) only, and sets
// no_new_privs. Filters stack: the I/O loop's is installed once the vCPU threads exist.
#pragma once

namespace agentvm {

enum class SeccompRole {
    vcpu,
    io_loop,           // serves a VM: agentvm run, episode, boot
    io_loop_snapshot,  // ... and then writes its snapshot: agentvm snapshot bake
    snapshot_worker,   // copies, syncs and hashes a live snapshot beside the I/O loop
};

// Installs the SIGSYS reporter (once per process) and the role's filter on this thread.
// Throws Error when the kernel refuses the filter.
void install_seccomp(SeccompRole role);

} // namespace agentvm
