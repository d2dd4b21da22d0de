// SIGINT, SIGTERM and SIGHUP end the VM through the same orderly path as a guest power-off:
// they are taken through a signalfd on the I/O loop. They are blocked before any thread
// starts, so every vCPU thread inherits the mask and none is picked to run a default handler.
#pragma once

#include "common/fd.hpp"
#include "vmm/vm.hpp"

namespace agentvm {

class StopSignals {
public:
    // Blocks the signals; construct before the VM's threads exist.
    StopSignals();
    // From now on a signal stops `vm` (VmOutcome::stopped, the signal's name as detail).
    void watch(Vm& vm);
    // The signal that stopped the VM, or 0.
    int received() const { return received_; }

private:
    Fd fd_;
    int received_ = 0;
};

} // namespace agentvm
