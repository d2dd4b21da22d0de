#include "service/ports/guest_socket_dirs.hpp"

#include <sys/un.h>

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"

namespace agentvm {

namespace {

namespace fs = std::filesystem;

// What a VM's socket path adds to the root: "/vm-XXXXXX/vsock", and the VMM's "_<port>" for
// connections out of the guest (vmm/vsock_host.hpp).
constexpr size_t vm_path_bytes = std::char_traits<char>::length("/vm-XXXXXX/vsock_4294967295");

} // namespace

GuestSocketDirs::GuestSocketDirs()
{
    const char* tmpdir = std::getenv("TMPDIR");
    std::string pattern = std::string(tmpdir && *tmpdir ? tmpdir : "/tmp") + "/agentvm-serve.XXXXXX";
    if (pattern.size() + vm_path_bytes >= sizeof(sockaddr_un{}.sun_path))
        throw Error(fmt::format("TMPDIR '{}' is too long a path for the VMs' vsock sockets (at most {} bytes)",
                                tmpdir ? tmpdir : "", sizeof(sockaddr_un{}.sun_path) - 1 - vm_path_bytes - 21));
    if (::mkdtemp(pattern.data()) == nullptr)
        throw_errno(fmt::format("making serve's directory for the VMs' vsock sockets ('{}')", pattern));
    root_ = std::move(pattern);
}

GuestSocketDirs::~GuestSocketDirs()
{
    std::error_code ec;
    fs::remove_all(root_, ec);
    if (ec)
        spdlog::error("removing '{}': {}", root_, ec.message());
}

std::string GuestSocketDirs::make()
{
    std::string dir = root_ + "/vm-XXXXXX";
    if (::mkdtemp(dir.data()) == nullptr)
        throw_errno(fmt::format("making a VM's vsock directory in '{}'", root_));
    return dir;
}

void GuestSocketDirs::remove(const std::string& dir)
{
    if (dir.empty() || fs::path(dir).parent_path() != fs::path(root_))
        return;
    std::error_code ec;
    fs::remove_all(dir, ec);
    if (ec)
        spdlog::error("removing a VM's vsock directory '{}': {}", dir, ec.message());
}

} // namespace agentvm
