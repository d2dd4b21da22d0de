// systemd's readiness protocol (sd_notify(3)), without libsystemd: a service of Type=notify is
// told where to report by $NOTIFY_SOCKET, a Unix datagram socket's path, or an abstract socket's
// name when it starts with '@'; each report is one datagram of "KEY=VALUE" lines (READY=1,
// STOPPING=1, STATUS=...). serve is the only reporter: the variable is taken out of the
// environment when read, so the episode children serve starts do not report in its name.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "common/fd.hpp"

namespace agentvm {

class SystemdNotifier {
public:
    // From $NOTIFY_SOCKET (then unset); nullopt when it is unset or empty: nothing listens.
    // Throws Error naming the problem when it is set but cannot be used (a relative path, too
    // long a name).
    static std::optional<SystemdNotifier> from_environment();
    // `address`: a path, or '@' and an abstract name, as $NOTIFY_SOCKET holds it.
    explicit SystemdNotifier(const std::string& address);

    // Sends `state` as one datagram, without waiting (serve's one thread must not block on a
    // full queue). A failure is logged, never thrown: serve serves whether or
    // not systemd hears it (systemd then times the start out, which says why in its journal).
    void notify(std::string_view state) const;
    // STATUS=, with newlines (which would start a new field) replaced by spaces.
    void status(std::string_view text) const;

private:
    std::string address_;
    Fd socket_;
};

} // namespace agentvm
