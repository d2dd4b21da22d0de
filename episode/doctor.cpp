#include "episode/doctor.hpp"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/fd.hpp"
#include "common/file_digest.hpp"
#include "episode/guest_location.hpp"
#include "episode/vm_options.hpp"
#include "vmm/cgroup.hpp"
#include "vmm/host_check.hpp"
#include "vmm/vm_limits.hpp"

namespace agentvm {
namespace {

Finding kvm_finding()
{
    const HostKvm kind = detect_host_kvm();
    if (kind != HostKvm::hardware)
        return {"KVM", Verdict::missing, kind == HostKvm::pvm ? "PVM (the kvm_pvm module)" : "none (no /dev/kvm)",
                host_kvm_problem(kind)};
    const Fd kvm(::open("/dev/kvm", O_RDWR | O_CLOEXEC));
    if (!kvm)
        return {"KVM", Verdict::missing, fmt::format("hardware, but /dev/kvm cannot be opened: {}", std::strerror(errno)),
                "run agentvm as root (its jail needs root) or as a member of group kvm"};
    return {"KVM", Verdict::ok, "hardware (/dev/kvm)", ""};
}

Finding root_finding()
{
    if (::geteuid() == 0)
        return {"privileges", Verdict::ok, "root", ""};
    return {"privileges", Verdict::missing, fmt::format("uid {}, not root", ::geteuid()),
            "run agentvm as root: the VMM's jail needs namespaces, pivot_root and its cgroup"};
}

Finding cgroup_finding()
{
    const bool unified = std::filesystem::exists("/sys/fs/cgroup/cgroup.controllers");
    const std::string version = unified ? "v2" : "v1";
    try {
        // The real thing: the group a VMM would get, removed again when `probe` goes.
        const VmCgroup probe = VmCgroup::create();
        return {"cgroups", Verdict::ok, fmt::format("{}; a VM's group can be created ({})", version, probe.dirs().front()),
                ""};
    } catch (const Error& e) {
        return {"cgroups", Verdict::missing, fmt::format("{}; a VM's group cannot be created: {}", version, e.what()),
                "delegate the cpu, memory and pids controllers to agentvm (run it as root on a host whose "
                "cgroups it may write), or run with --cpu-quota 0 --vmm-mem 0 for no limits"};
    }
}

Finding io_uring_finding()
{
    io_uring ring {};
    if (const int err = io_uring_queue_init(4, &ring, 0); err < 0)
        return {"io_uring", Verdict::missing, fmt::format("cannot set up a ring: {}", std::strerror(-err)),
                "agentvm's event loop needs io_uring, which this kernel or a container's seccomp profile "
                "refuses here: run agentvm on the host itself, on a kernel with io_uring enabled"};
    io_uring_queue_exit(&ring);
    return {"io_uring", Verdict::ok, "available", ""};
}

Finding memory_finding()
{
    const uint64_t host = host_ram_mib();
    // A default VM: 512 MiB of guest memory and the VMM's own.
    const uint64_t needed = VmRequest{}.mem_mib + vmm_overhead_mib;
    if (host < needed)
        return {"memory", Verdict::missing, fmt::format("{} MiB of RAM", host),
                fmt::format("a default VM needs {} MiB; give smaller ones --mem", needed)};
    return {"memory", Verdict::ok, fmt::format("{} MiB of RAM", host), ""};
}

// The kernel's "Linux version ..." banner, found in the image itself.
std::string kernel_version(const std::filesystem::path& vmlinux)
{
    std::ifstream in(vmlinux, std::ios::binary);
    const std::string image((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = image.find("Linux version ");
    if (at == std::string::npos)
        return "no version banner";
    const size_t end = image.find_first_of(std::string("\n\0 ", 3), at + 14);
    return image.substr(at, std::min(end, image.size()) - at);
}

// A guest file: where, how large and which (the start of its content digest, as snapshots record it).
Finding guest_file_finding(const GuestLocation& guest, const std::string& name, const std::string& what,
                           Verdict when_missing, const std::string& needed_by)
{
    const auto path = guest.dir / name;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec))
        return {what, when_missing, fmt::format("{} not found (from {})", path.string(), describe(guest.source)),
                fmt::format("needed by {}. From a checkout: ./setup.sh build; from the package: apt-get install "
                            "--reinstall agentvm; or point AGENTVM_GUEST_DIR at a directory holding {}",
                            needed_by, name)};
    std::string detail = fmt::format("{} (from {}), {:.1f} MiB, sha256 {}", path.string(), describe(guest.source),
                                     static_cast<double>(std::filesystem::file_size(path, ec)) / (1 << 20),
                                     content_digest_of(path.string()).substr(0, 16));
    if (name == "vmlinux")
        detail += ", " + kernel_version(path);
    return {what, Verdict::ok, detail, ""};
}

Finding snapshot_finding(const GuestLocation& guest)
{
    std::error_code ec;
    if (std::filesystem::exists(guest.snapshot / "manifest.json", ec))
        return {"default snapshot", Verdict::ok, fmt::format("{} (baked)", guest.snapshot.string()), ""};
    return {"default snapshot", Verdict::warning, fmt::format("{} not baked yet", guest.snapshot.string()),
            guest.source == GuestSource::installed
                ? "run and episode bake it on first use; `agentvm snapshot bake --default` does it now"
                : "without it run and episode boot cold; `agentvm snapshot bake --default` bakes it"};
}

Finding template_tools_finding()
{
    std::vector<std::string> absent;
    for (const char* tool : {"skopeo", "umoci", "buildah"}) {
        bool found = false;
        const char* path = std::getenv("PATH");
        std::string dirs = path ? path : "/usr/bin:/bin";
        for (size_t start = 0; start <= dirs.size() && !found;) {
            const size_t end = std::min(dirs.find(':', start), dirs.size());
            found = ::access((dirs.substr(start, end - start) + "/" + tool).c_str(), X_OK) == 0;
            start = end + 1;
        }
        if (!found)
            absent.push_back(tool);
    }
    if (absent.empty())
        return {"template tools", Verdict::ok, "skopeo, umoci, buildah", ""};
    return {"template tools", Verdict::warning, fmt::format("not found: {}", fmt::join(absent, ", ")),
            "agentvm template build from images needs them: apt-get install skopeo umoci buildah"};
}

} // namespace

std::vector<Finding> examine_host()
{
    std::vector<Finding> findings = {kvm_finding(), root_finding(), cgroup_finding(), io_uring_finding(),
                                     memory_finding()};
    const GuestLocation guest = default_guest();
    findings.push_back(guest_file_finding(guest, "vmlinux", "guest kernel", Verdict::missing, "run and episode"));
    findings.push_back(guest_file_finding(guest, "rootfs.ext4", "guest root filesystem", Verdict::missing,
                                          "run and episode"));
    findings.push_back(guest_file_finding(guest, "agentvm-init", "guest init", Verdict::warning, "template build"));
    findings.push_back(
        guest_file_finding(guest, "agent/agentvm-agent", "guest agent", Verdict::warning, "template build"));
    findings.push_back(snapshot_finding(guest));
    findings.push_back(template_tools_finding());
    return findings;
}

} // namespace agentvm
