#include "vmm/host_check.hpp"

#include <sys/stat.h>

namespace agentvm {
namespace {

bool exists(const char* path)
{
    struct stat st {};
    return ::stat(path, &st) == 0;
}

} // namespace

HostKvm detect_host_kvm()
{
    if (!exists("/dev/kvm"))
        return HostKvm::none;
    if (exists("/sys/module/kvm_pvm"))
        return HostKvm::pvm;
    return HostKvm::hardware;
}

std::string host_kvm_problem(HostKvm kind)
{
    switch (kind) {
    case HostKvm::hardware:
        return {};
    case HostKvm::pvm:
        return "/dev/kvm on this host is PVM (kvm_pvm), which cannot boot a normal Linux guest; "
               "run agentvm through the emulated test host: tests/testhost/run -- agentvm ...";
    case HostKvm::none:
        return "this host has no /dev/kvm; run agentvm on a host with hardware KVM, or through the "
               "emulated test host: tests/testhost/run -- agentvm ...";
    }
    return {};
}

} // namespace agentvm
