#include "episode/stop_signals.hpp"

#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cstring>

#include "common/error.hpp"

namespace agentvm {

StopSignals::StopSignals()
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    if (::pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0)
        throw Error("cannot block SIGINT/SIGTERM/SIGHUP");
    fd_ = Fd(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
    if (!fd_)
        throw_errno("signalfd");
}

void StopSignals::watch(Vm& vm)
{
    vm.event_loop().watch_readable(fd_.get(), [this, &vm] {
        signalfd_siginfo info{};
        if (::read(fd_.get(), &info, sizeof(info)) != sizeof(info) || received_ != 0)
            return;
        received_ = static_cast<int>(info.ssi_signo);
        vm.stop(VmOutcome::stopped, strsignal(received_));
    });
}

} // namespace agentvm
