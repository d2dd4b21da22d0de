// agentvm-init: PID 1 of an agentvm guest (kernel command line: init=/sbin/agentvm-init).
//
// It sets up the few things every program expects (filesystems, lo, hostname,
// environment), prints "agentvm-init: ready", starts the tool-call agent (and restarts it
// whenever it dies), runs the command the VMM passed as
// agentvm.init_cmd=<base64> through /bin/sh -c (or, under agentvm.serve, nothing but the
// agent; else an interactive shell), reports how it ended and powers the VM off. It never returns from main: PID 1
// exiting panics the kernel, so every way out, errors included, goes through power_off().
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <optional>
#include <string>

#include "guest/agent_service.hpp"
#include "guest/calls_cgroup.hpp"
#include "protocol/cmdline.hpp"
#include "guest/console.hpp"
#include "guest/grow_root.hpp"
#include "guest/image_defaults.hpp"
#include "guest/loopback.hpp"
#include "guest/mounts.hpp"
#include "guest/power.hpp"
#include "guest/read_file.hpp"
#include "guest/spawn.hpp"
#include "common/base64.hpp"

namespace agentvm {

namespace {

constexpr char hostname[] = "agentvm";
// Far above any kernel's COMMAND_LINE_SIZE (2048 on x86).
constexpr size_t max_cmdline_bytes = 64 * 1024;

// The kernel hands init HOME=/ TERM=linux plus any command-line words it did not know;
// start from a clean, predictable environment instead.
void set_environment()
{
    ::clearenv();
    ::setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 1);
    ::setenv("HOME", "/root", 1);
    ::setenv("TERM", "linux", 1);
    ::setenv("LANG", "C.UTF-8", 1);
    ::setenv("USER", "root", 1);
}

void run_interactive_shell(const ReapedChild& on_reaped)
{
    const char* shell = ::access("/bin/bash", X_OK) == 0 ? "/bin/bash" : "/bin/sh";
    if (std::optional<int> status = run_on_console({shell, "-l"}, "/root", on_reaped))
        report_exit("shell", *status);
}

void run()
{
    if (!mount_dev())
        return;
    ensure_console();
    say("ready");

    if (!mount_filesystems())
        return;
    if (::sethostname(hostname, sizeof(hostname) - 1) != 0)
        say_errno("sethostname");
    bring_up_loopback();
    set_environment();
    // A template's image may set variables (PATH too) and the tool calls' working directory.
    const std::string workdir = apply_image_defaults();

    std::optional<std::string> cmdline = read_small_file("/proc/cmdline", max_cmdline_bytes);
    if (!cmdline) {
        say_errno("read /proc/cmdline");
        return;
    }
    if (find_cmdline_param(*cmdline, grow_root_param))
        grow_root_filesystem();
    uint32_t pids_max = default_pids_max;
    if (const auto given = find_cmdline_param(*cmdline, pids_max_param)) {
        if (const auto n = parse_pids_max(*given))
            pids_max = *n;
        else
            say("ignoring %s=%s: not a number from 1 to %u", pids_max_param.data(), given->c_str(), max_pids_max);
    }
    // Without the cgroup the agent still serves calls (the guest is only less protected
    // against itself); the console says why.
    AgentService agent(make_calls_cgroup(pids_max), workdir.empty() ? "/root" : workdir);
    agent.start();
    const ReapedChild on_reaped = [&agent](pid_t pid, int status) { agent.on_reaped(pid, status); };

    if (find_cmdline_param(*cmdline, serve_param)) {
        // The host ends the VM when it is done with it; the guest only ends it when nothing
        // is left to serve tool calls, so the host learns of it at once.
        reap_while([&agent] { return agent.running(); }, on_reaped);
        say("the agent is gone; powering off");
        return;
    }
    std::optional<std::string> encoded = find_cmdline_param(*cmdline, init_cmd_param);
    if (!encoded) {
        run_interactive_shell(on_reaped);
        return;
    }
    std::optional<std::string> command = base64_decode(*encoded);
    if (!command) {
        say("malformed %s: not padded standard base64", init_cmd_param.data());
        return;
    }
    if (command->find('\0') != std::string::npos) {
        say("malformed %s: the command contains a NUL byte", init_cmd_param.data());
        return;
    }
    if (std::optional<int> status = run_on_console({"/bin/sh", "-c", *command}, "/root", on_reaped))
        report_exit("init-cmd", *status);
}

} // namespace

} // namespace agentvm

int main()
{
    try {
        agentvm::run();
    } catch (const std::exception& e) {
        agentvm::say("fatal: %s", e.what());
    } catch (...) {
        agentvm::say("fatal: unknown exception");
    }
    agentvm::power_off();
}
