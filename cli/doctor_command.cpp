#include <CLI/CLI.hpp>

#include "cli/doctor_command.hpp"

#include <cstdio>

#include <fmt/format.h>

#include "agentvm_config.hpp"
#include "episode/doctor.hpp"
#include "episode/exit_codes.hpp"

namespace agentvm {
namespace {

const char* label(Verdict verdict)
{
    switch (verdict) {
    case Verdict::ok:
        return "ok";
    case Verdict::warning:
        return "warning";
    case Verdict::missing:
        return "MISSING";
    }
    return "";
}

int print_findings()
{
    fmt::print("agentvm {}\n", AGENTVM_VERSION);
    int missing = 0;
    for (const Finding& finding : examine_host()) {
        fmt::print("{:<8} {}: {}\n", label(finding.verdict), finding.what, finding.detail);
        if (!finding.fix.empty())
            fmt::print("{:<8} -> {}\n", "", finding.fix);
        missing += finding.verdict == Verdict::missing;
    }
    if (missing)
        fmt::print("{} missing: agentvm run and episode cannot work here until {} fixed (above)\n", missing,
                   missing == 1 ? "it is" : "they are");
    else
        fmt::print("nothing missing\n");
    std::fflush(stdout);
    return missing ? exit_code::error : exit_code::ok;
}

} // namespace

Subcommand add_doctor_command(CLI::App& app)
{
    auto* doctor = app.add_subcommand(
        "doctor", "Check what this host offers agentvm (KVM, cgroups, io_uring, memory, the guest's files) and say "
                  "what to do about each problem; exit 1 when something run and episode need is missing");
    return {doctor, [] { return print_findings(); }};
}

} // namespace agentvm
