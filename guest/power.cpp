#include "guest/power.hpp"

#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <ctime>

#include "guest/console.hpp"

namespace agentvm {

namespace {

double now_seconds()
{
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// Reaps children until none are left or `timeout` seconds pass. Every process in the guest
// ends up a child of init once its parent dies, so "no children" means "no processes".
bool reap_all(double timeout)
{
    double deadline = now_seconds() + timeout;
    for (;;) {
        pid_t pid = ::waitpid(-1, nullptr, WNOHANG);
        if (pid > 0)
            continue;
        if (pid < 0 && errno == ECHILD)
            return true;
        if (now_seconds() >= deadline)
            return false;
        timespec pause{0, 10'000'000};
        ::nanosleep(&pause, nullptr);
    }
}

} // namespace

void power_off()
{
    // kill(-1) reaches every process but init itself.
    ::kill(-1, SIGTERM);
    if (!reap_all(1.0)) {
        ::kill(-1, SIGKILL);
        if (!reap_all(1.0))
            say("processes left after SIGKILL, powering off anyway");
    }
    ::sync();
    if (::mount(nullptr, "/", nullptr, MS_REMOUNT | MS_RDONLY, nullptr) != 0)
        say_errno("remount / read-only");
    say("power-off");
    drain_console();
    ::reboot(RB_AUTOBOOT);
    say_errno("reboot");
    for (;;)
        ::pause();
}

} // namespace agentvm
