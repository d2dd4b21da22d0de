// The VM's life from the outside: console input reaches the guest through the UART's
// interrupt path, and SIGINT/SIGTERM end a running VM cleanly with 128+N, even one whose
// console reader stopped reading.
#include <doctest/doctest.h>

#include <filesystem>

#include "tests/vm/vm_test.hpp"

using namespace agentvm::test;

namespace {

// Runs a shell script where a real guest can boot, with AGENTVM set to the binary.
ProcessResult run_script(const std::string& script)
{
    return run_in_testhost({"sh", "-c", std::string("AGENTVM=") + AGENTVM_BIN + "; " + script});
}

} // namespace

TEST_CASE("host stdin reaches the guest console; its end is the guest shell's end")
{
    const std::string console = std::string(VM_TEST_DIR) + "/console-stdin.log";
    std::filesystem::remove(console);
    // No --init-cmd: init runs an interactive shell on the console. As a person would, the
    // script types only once the prompt shows (bytes sent before the guest's tty is open are
    // lost, as on a real serial line); then host EOF arrives as ^D, the shell ends and the
    // guest powers off.
    const auto r = run_script(
        "(for i in $(seq 600); do grep -q 'root@agentvm' " + console + " 2>/dev/null && break; sleep 0.2; done; "
        "printf 'echo typed-$((6*7))\\n') | \"$AGENTVM\" boot --console " + console);
    const std::string text = read_file(console);
    INFO("stderr: " << r.err << "\nconsole: " << text);
    CHECK(r.exit_code == 0);
    CHECK(text.find("typed-42") != std::string::npos);
    CHECK(text.find("agentvm-init: shell exited 0") != std::string::npos);
}

TEST_CASE("SIGINT tears a running VM down with 128+N and nothing left behind")
{
    const std::string console = std::string(VM_TEST_DIR) + "/console-signal-INT.log";
    std::filesystem::remove(console);
    // Wait for the guest command to be running, signal agentvm, then report its status and
    // whether any agentvm process survived.
    const auto r = run_script(
        "\"$AGENTVM\" boot --console " + console + " --init-cmd 'echo sleeping; sleep 1000' & pid=$!; "
        "for i in $(seq 600); do grep -q sleeping " + console + " 2>/dev/null && break; sleep 0.2; done; "
        "kill -INT $pid; wait $pid; echo status=$?; "
        "sleep 0.5; if kill -0 $pid 2>/dev/null; then echo survivor; fi");
    INFO("stdout: " << r.out << "\nstderr: " << r.err);
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("status=130") != std::string::npos);
    CHECK(r.out.find("survivor") == std::string::npos);
    CHECK(r.err.find("VM stopped") != std::string::npos);
}

TEST_CASE("SIGTERM stops a VM flooding a console nobody reads, within 2 s, with 143")
{
    // The scenario is console_flood_check.py: a vCPU that waited on the stalled console
    // would never see the kick, and the VM would never stop.
    const auto r = run_in_testhost({"python3", CONSOLE_FLOOD_CHECK, AGENTVM_BIN});
    INFO("stdout: " << r.out << "\nstderr: " << r.err);
    CHECK(r.exit_code == 0);
    REQUIRE(r.out.find("flood-seen") != std::string::npos);
    CHECK(r.out.find("missed-deadline") == std::string::npos);
    CHECK(r.out.find("status=143") != std::string::npos);
    CHECK(r.err.find("VM stopped") != std::string::npos);
    // The bytes the reader never took were dropped and counted, not waited for.
    CHECK(r.err.find("console output dropped") != std::string::npos);
}
