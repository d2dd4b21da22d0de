#include "episode/exit_codes.hpp"

namespace agentvm::exit_code {

int from(const VmResult& result, int stop_signal)
{
    switch (result.outcome) {
    case VmOutcome::powered_off:
    case VmOutcome::finished:
        return ok;
    case VmOutcome::panicked:
        return guest_panic;
    case VmOutcome::failed:
        return vm_failure;
    case VmOutcome::stopped:
        return signal_base + stop_signal;
    }
    return error;
}

} // namespace agentvm::exit_code
