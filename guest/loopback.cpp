#include "guest/loopback.hpp"

#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cstring>

#include "guest/console.hpp"
#include "common/fd.hpp"

namespace agentvm {

void bring_up_loopback()
{
    Fd sock(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!sock) {
        say_errno("loopback: socket");
        return;
    }
    ifreq request{};
    std::strncpy(request.ifr_name, "lo", IFNAMSIZ - 1);
    if (::ioctl(sock.get(), SIOCGIFFLAGS, &request) != 0) {
        say_errno("loopback: SIOCGIFFLAGS lo");
        return;
    }
    request.ifr_flags = static_cast<short>(request.ifr_flags | IFF_UP);
    if (::ioctl(sock.get(), SIOCSIFFLAGS, &request) != 0)
        say_errno("loopback: SIOCSIFFLAGS lo");
}

} // namespace agentvm
