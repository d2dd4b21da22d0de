#include "tests/hostile/hostile_test.hpp"

#include <doctest/doctest.h>

#include <map>
#include <sstream>

#include "tests/vm/vm_test.hpp"

namespace agentvm::test {
namespace {

// The lines hostile_check.py printed about one attack (its verdict, and a console tail on
// failure), so that a failed case shows its own story rather than the whole group's.
std::string lines_about(const std::string& out, const std::string& attack)
{
    std::istringstream in(out);
    std::string about;
    bool inside = false;
    for (std::string line; std::getline(in, line);) {
        const bool verdict = line.rfind("ok ", 0) == 0 || line.rfind("FAIL ", 0) == 0;
        if (verdict)
            inside = line.find(" " + attack + ":") != std::string::npos;
        if (inside || line.find("(" + attack + ")") != std::string::npos)
            about += line + "\n";
    }
    return about.empty() ? out : about;
}

} // namespace

const ProcessResult& hostile_group(const std::string& group)
{
    static std::map<std::string, ProcessResult> runs;
    auto it = runs.find(group);
    if (it == runs.end()) {
        // Emulated, a group takes one to five minutes (filling a disk and flooding output are
        // the slow parts); the limit leaves room for a loaded machine.
        it = runs.emplace(group, run_in_testhost({"python3", HOSTILE_CHECK, AGENTVM_BIN, "--group", group},
                                                 std::chrono::seconds(1500)))
                 .first;
        MESSAGE("hostile_check.py --group " << group << " (exit " << it->second.exit_code << "):\n"
                                           << it->second.out << it->second.err);
    }
    return it->second;
}

void check_attack(const ProcessResult& run, const std::string& attack)
{
    INFO(lines_about(run.out, attack));
    INFO("stderr: " << run.err);
    CHECK_MESSAGE(run.out.find("ok " + attack + ":") != std::string::npos, attack);
}

void check_group_end(const ProcessResult& run)
{
    INFO("stdout: " << run.out << "\nstderr: " << run.err);
    CHECK(run.out.find(" 0 failed") != std::string::npos);
    CHECK(run.exit_code == 0);
}

} // namespace agentvm::test
