#include "guest/agent/listen_address.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
// After sys/socket.h, which it needs.
#include <linux/vm_sockets.h>

#include <cerrno>
#include <cstring>

#include "common/error.hpp"
#include "common/whole_number.hpp"

namespace agentvm {

ListenAddress parse_listen_address(std::string_view text)
{
    ListenAddress address;
    if (text.starts_with("unix:")) {
        address.kind = ListenAddress::Kind::unix_socket;
        address.path = std::string(text.substr(5));
        if (address.path.empty() || address.path.size() >= sizeof(sockaddr_un::sun_path))
            throw Error("--listen unix:PATH: the path must be 1-107 bytes");
        return address;
    }
    if (text.starts_with("vsock:")) {
        const std::optional<uint32_t> port = whole_number<uint32_t>(text.substr(6));
        // VMADDR_PORT_ANY (-1U) means "pick one", useless for a fixed agent address.
        if (!port || *port == 0 || *port == VMADDR_PORT_ANY)
            throw Error("--listen vsock:PORT: PORT must be a number from 1 to 4294967294");
        address.port = *port;
        return address;
    }
    throw Error("--listen: expected vsock:PORT or unix:PATH, got \"" + std::string(text) + "\"");
}

Fd listen_on(const ListenAddress& address)
{
    if (address.kind == ListenAddress::Kind::vsock) {
        Fd fd(::socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0));
        if (!fd)
            throw_errno("socket(AF_VSOCK)");
        sockaddr_vm addr{};
        addr.svm_family = AF_VSOCK;
        addr.svm_cid = VMADDR_CID_ANY;
        addr.svm_port = address.port;
        if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
            throw_errno("bind vsock:" + std::to_string(address.port));
        if (::listen(fd.get(), 16) != 0)
            throw_errno("listen");
        return fd;
    }
    Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd)
        throw_errno("socket(AF_UNIX)");
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, address.path.data(), address.path.size());
    if (::unlink(address.path.c_str()) != 0 && errno != ENOENT)
        throw_errno("unlink " + address.path);
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
        throw_errno("bind " + address.path);
    if (::listen(fd.get(), 16) != 0)
        throw_errno("listen");
    return fd;
}

} // namespace agentvm
