// The VMM's supervisor, jail and cgroup (needs root, as agentvm does): the VMM child is PID 1
// of its own namespace and starts with only stdin, stdout and stderr; its status comes back,
// a kill is reported, a deadline is kept; lock_down leaves the child only the directories it
// keeps, read-only elsewhere, no capabilities, no network, the rlimits asked; the cgroup
// holds the child, enforces its memory limit and is gone afterwards.
//
// Each case runs supervise() in a forked test process that then _exits: a process that has
// made a PID namespace for its children can start no more threads, which the sanitizers'
// leak check at exit needs.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <tuple>
#include <utility>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <grp.h>

#include "common/error.hpp"
#include "vmm/cgroup.hpp"
#include "vmm/jail.hpp"
#include "vmm/supervisor.hpp"

using namespace agentvm;
namespace fs = std::filesystem;

namespace {

// Runs body in a forked process and returns what it exited with (-1: killed).
int in_test_process(const std::function<int()>& body)
{
    std::fflush(nullptr);  // or the children would print the runner's buffered output again
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        int code = 99;
        try {
            code = body();
        } catch (const std::exception& e) {
            std::fprintf(stderr, "test process: %s\n", e.what());
        }
        ::_exit(code);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// supervise() in a test process: its status, or 98 if the VMM side ever returned there.
int supervised(const Supervision& supervision, const std::function<int()>& vmm)
{
    return in_test_process([&] {
        const int status = supervise(supervision, vmm);
        if (::getpid() == 1)
            ::_exit(status);  // the VMM child: its body's result
        return status;
    });
}

std::string slurp(const fs::path& path)
{
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

struct TempDir {
    fs::path path;
    TempDir()
    {
        char name[] = "/tmp/agentvm-jail-test-XXXXXX";
        REQUIRE(::mkdtemp(name) != nullptr);
        path = name;
    }
    ~TempDir() { fs::remove_all(path); }
};

} // namespace

TEST_CASE("the VMM child is PID 1 of its own namespace and starts with stdio only")
{
    // Inherited, well above the descriptors the supervisor itself passes on: must be closed.
    const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    REQUIRE(null_fd >= 0);
    const int fd = ::fcntl(null_fd, F_DUPFD, 20);
    ::close(null_fd);
    REQUIRE(fd >= 20);
    const int status = supervised({}, [fd] {
        if (::getpid() != 1)
            return 10;
        if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF)
            return 11;
        if (::fcntl(STDERR_FILENO, F_GETFD) == -1)
            return 12;
        return 42;
    });
    ::close(fd);
    CHECK(status == 42);
}

TEST_CASE("a VMM killed by a signal is reported with the killed code")
{
    Supervision supervision;
    supervision.killed_code = 77;
    // The test runner's crash handler must not catch it in the child.
    const auto crash = [] {
        std::signal(SIGILL, SIG_DFL);
        __builtin_trap();
        return 0;
    };
    CHECK(supervised(supervision, crash) == 77);
    CHECK(supervised({}, crash) == 128 + SIGILL);
}

TEST_CASE("a VMM still running at its hard deadline is killed")
{
    Supervision supervision;
    supervision.hard_deadline = std::chrono::milliseconds(200);
    supervision.killed_code = 66;
    const auto start = std::chrono::steady_clock::now();
    CHECK(supervised(supervision, [] {
              for (;;)
                  ::pause();
              return 0;
          }) == 66);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
}

TEST_CASE("lock_down leaves the kept directory, and nothing else of the host, without privileges")
{
    TempDir kept;
    const int status = supervised({}, [&] {
        JailSpec spec;
        spec.dirs = {{kept.path.string(), true}};
        spec.max_open_files = 128;
        spec.max_file_bytes = 1 << 20;
        lock_down(spec);
        std::vector<std::string> seen;
        auto note = [&](const std::string& what, bool ok) { seen.push_back(what + (ok ? "=ok" : "=BAD")); };
        {
            std::ofstream out(kept.path / "written");
            out << "inside";
            note("kept dir writable", static_cast<bool>(out));
        }
        note("host file gone", ::access("/etc/passwd", F_OK) != 0 && errno == ENOENT);
        note("proc gone", ::access("/proc/self", F_OK) != 0);
        note("root read-only", ::mkdir("/new", 0755) != 0 && errno == EROFS);
        __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
        __user_cap_data_struct caps[2] = {};
        note("capget", ::syscall(SYS_capget, &header, caps) == 0);
        note("no capabilities", caps[0].effective == 0 && caps[0].permitted == 0 && caps[1].effective == 0 &&
                                    caps[1].permitted == 0 && ::prctl(PR_CAPBSET_READ, CAP_SYS_ADMIN) == 0);
        note("no_new_privs", ::prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1);
        rlimit files{}, size{};
        ::getrlimit(RLIMIT_NOFILE, &files);
        ::getrlimit(RLIMIT_FSIZE, &size);
        note("open files limit", files.rlim_cur == 128 && files.rlim_max == 128);
        note("file size limit", size.rlim_cur == (1 << 20));
        const int sock = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in loopback{};
        loopback.sin_family = AF_INET;
        loopback.sin_port = htons(22);
        loopback.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        note("no network", ::connect(sock, reinterpret_cast<sockaddr*>(&loopback), sizeof loopback) != 0 &&
                               errno == ENETUNREACH);
        std::ofstream report(kept.path / "report");
        for (const auto& line : seen)
            report << line << "\n";
        return 0;
    });
    CHECK(status == 0);
    CHECK(slurp(kept.path / "written") == "inside");
    const std::string report = slurp(kept.path / "report");
    INFO(report);
    CHECK(report.find("=BAD") == std::string::npos);
    CHECK(report.find("no network=ok") != std::string::npos);
}

namespace {

// Two VMs' identities, from serve's default range (service/vm_users/jail_ids.hpp).
constexpr JailIdentity first_vm{1879048192 + 101, 1879048192 + 101};
constexpr JailIdentity second_vm{1879048192 + 102, 1879048192 + 102};

// What serve does with a VM's writable directory: its own, shared with the VM's group.
void share_with(const fs::path& dir, gid_t gid)
{
    REQUIRE(::chown(dir.c_str(), static_cast<uid_t>(-1), gid) == 0);
    REQUIRE(::chmod(dir.c_str(), 0770) == 0);
}

// A jailed VMM as `identity` keeping `dir` writable: writes `dir`/file and a report of what
// it is; the status of its supervise().
int jailed_as(const JailIdentity& identity, const fs::path& dir)
{
    return supervised({}, [&] {
        JailSpec spec;
        spec.dirs = {{dir.string(), true}};
        spec.identity = identity;
        try {
            lock_down(spec);
        } catch (const Error& e) {
            std::fprintf(stderr, "%s\n", e.what());
            return 30;
        }
        uid_t ruid = 0, euid = 0, suid = 0;
        gid_t rgid = 0, egid = 0, sgid = 0;
        ::getresuid(&ruid, &euid, &suid);
        ::getresgid(&rgid, &egid, &sgid);
        int death_signal = 0;
        ::prctl(PR_GET_PDEATHSIG, &death_signal);
        const mode_t mask = ::umask(0);
        ::umask(mask);
        __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
        __user_cap_data_struct caps[2] = {};
        ::syscall(SYS_capget, &header, caps);
        std::ofstream(dir / "file") << "secret";
        std::ofstream report(dir / "report");
        report << fmt::format("uid {} {} {} gid {} {} {} groups {} pdeathsig {} umask {:o} caps {}\n", ruid, euid,
                              suid, rgid, egid, sgid, ::getgroups(0, nullptr), death_signal, mask,
                              caps[0].permitted | caps[1].permitted | caps[0].effective | caps[1].effective);
        return 0;
    });
}

// Whether a process with `identity` (and no other group) can open `path` for reading.
bool readable_as(const JailIdentity& identity, const fs::path& path)
{
    return in_test_process([&] {
               if (::setgroups(0, nullptr) != 0 || ::setresgid(identity.gid, identity.gid, identity.gid) != 0 ||
                   ::setresuid(identity.uid, identity.uid, identity.uid) != 0)
                   return 2;
               const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
               if (fd < 0)
                   return errno == EACCES ? 1 : 3;
               ::close(fd);
               return 0;
           }) == 0;
}

} // namespace

TEST_CASE("with an identity, each VMM is its own unprivileged uid and gid, and another VM's files are closed to it")
{
    TempDir first, second;
    share_with(first.path, first_vm.gid);
    share_with(second.path, second_vm.gid);
    REQUIRE(jailed_as(first_vm, first.path) == 0);
    REQUIRE(jailed_as(second_vm, second.path) == 0);
    CHECK(slurp(first.path / "report") ==
          fmt::format("uid {0} {0} {0} gid {1} {1} {1} groups 0 pdeathsig {2} umask 7 caps 0\n", first_vm.uid,
                      first_vm.gid, SIGKILL));
    struct stat st {};
    REQUIRE(::stat((first.path / "file").c_str(), &st) == 0);
    CHECK(st.st_uid == first_vm.uid);
    CHECK(st.st_gid == first_vm.gid);
    CHECK((st.st_mode & 07777) == 0660);
    CHECK(readable_as(first_vm, first.path / "file"));
    CHECK_FALSE(readable_as(first_vm, second.path / "file"));
    CHECK_FALSE(readable_as(second_vm, first.path / "file"));
}

TEST_CASE("with an identity, a kept directory it cannot write is named, and its supervisor can still kill it")
{
    TempDir unshared;
    REQUIRE(::chmod(unshared.path.c_str(), 0700) == 0);
    CHECK(jailed_as(first_vm, unshared.path) == 30);

    TempDir kept;
    share_with(kept.path, first_vm.gid);
    Supervision supervision;
    supervision.hard_deadline = std::chrono::milliseconds(300);
    supervision.killed_code = 66;
    CHECK(supervised(supervision, [&] {
              JailSpec spec;
              spec.dirs = {{kept.path.string(), true}};
              spec.identity = first_vm;
              lock_down(spec);
              for (;;)
                  ::pause();
              return 0;
          }) == 66);
}

TEST_CASE("the VMM's cgroup holds it, enforces its memory limit, and is removed after it")
{
    const int status = in_test_process([&] {
        std::vector<std::string> dirs;
        int result = 0;
        {
            VmCgroup cgroup = VmCgroup::create();
            dirs = cgroup.dirs();
            for (const auto& dir : dirs)
                if (!fs::is_directory(dir))
                    return 20;
            Supervision supervision;
            supervision.cgroup = &cgroup;
            supervision.killed_code = 55;
            const int vmm_status = supervise(supervision, [&] {
                cgroup.limit({0.5, 64 << 20, 64});
                cgroup.wait_joined();
                // Touch far more than the limit: the kernel's OOM killer must end this process.
                const size_t size = size_t{512} << 20;
                auto* bytes = static_cast<volatile char*>(std::malloc(size));
                for (size_t i = 0; bytes && i < size; i += 4096)
                    bytes[i] = 1;
                return 21;
            });
            if (::getpid() == 1)
                ::_exit(vmm_status);
            if (vmm_status != 55)
                return vmm_status;
            result = cgroup.memory_limit_hit() ? 0 : 22;
        }
        for (const auto& dir : dirs)
            if (fs::exists(dir))
                return 23;
        return result;
    });
    CHECK(status == 0);
}

TEST_CASE("a group left by a supervisor that was killed is removed by the next one, once it is old")
{
    // Pids of processes that have ended.
    const auto dead_pid = [] {
        const pid_t pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0)
            ::_exit(0);
        REQUIRE(::waitpid(pid, nullptr, 0) == pid);
        return pid;
    };
    const pid_t old_dead = dead_pid();
    const pid_t young_dead = dead_pid();
    // Beside each of this process's groups: the name pattern is the group's with another pid.
    std::vector<fs::path> parents;
    std::string prefix;
    {
        const VmCgroup probe = VmCgroup::create();
        for (const auto& dir : probe.dirs()) {
            const std::string name = fs::path(dir).filename();
            prefix = name.substr(0, name.size() - std::to_string(::getpid()).size());
            parents.push_back(fs::path(dir).parent_path());
        }
    }
    const auto group = [&](const fs::path& parent, pid_t pid) { return parent / (prefix + std::to_string(pid)); };
    const timespec two_minutes_ago[2] = {{::time(nullptr) - 120, 0}, {::time(nullptr) - 120, 0}};
    for (const auto& parent : parents) {
        for (const pid_t pid : {old_dead, young_dead, ::getppid()})
            REQUIRE(fs::create_directory(group(parent, pid)));
        REQUIRE(::utimensat(AT_FDCWD, group(parent, old_dead).c_str(), two_minutes_ago, 0) == 0);
        REQUIRE(::utimensat(AT_FDCWD, group(parent, ::getppid()).c_str(), two_minutes_ago, 0) == 0);
    }
    {
        const VmCgroup next = VmCgroup::create();
    }
    for (const auto& parent : parents) {
        CHECK_FALSE(fs::exists(group(parent, old_dead)));
        CHECK(fs::exists(group(parent, young_dead)));   // may be a supervisor in another PID namespace
        CHECK(fs::exists(group(parent, ::getppid())));  // its supervisor lives
        for (const pid_t pid : {old_dead, young_dead, ::getppid()})
            ::rmdir(group(parent, pid).c_str());
    }
}

TEST_CASE("the jail's privileges: root has them; without one the start is refused, naming it")
{
    CHECK_NOTHROW(check_jail_privileges());
    CHECK_NOTHROW(check_jail_privileges(true));
    for (const auto& [cap, name, identity] :
         {std::tuple{CAP_SYS_ADMIN, "CAP_SYS_ADMIN", false}, std::tuple{CAP_SETPCAP, "CAP_SETPCAP", false},
          std::tuple{CAP_SETUID, "CAP_SETUID", true}, std::tuple{CAP_SETGID, "CAP_SETGID", true},
          std::tuple{CAP_KILL, "CAP_KILL", true}}) {
        CAPTURE(name);
        const int status = in_test_process([cap = cap, name = name, identity = identity] {
            __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
            __user_cap_data_struct held[_LINUX_CAPABILITY_U32S_3] = {};
            if (::syscall(SYS_capget, &header, held) != 0)
                return 2;
            held[CAP_TO_INDEX(cap)].effective &= ~CAP_TO_MASK(cap);
            if (::syscall(SYS_capset, &header, held) != 0)
                return 3;
            if (!identity) {
                try {
                    check_jail_privileges(false);
                } catch (const Error& e) {
                    return std::string(e.what()).find(name) != std::string::npos ? 0 : 4;
                }
                return 5;
            }
            // Needed only for a VMM that switches its identity.
            try {
                check_jail_privileges(false);
            } catch (const Error&) {
                return 6;
            }
            try {
                check_jail_privileges(true);
            } catch (const Error& e) {
                return std::string(e.what()).find(name) != std::string::npos ? 0 : 4;
            }
            return 5;
        });
        CHECK(status == 0);
    }
}
