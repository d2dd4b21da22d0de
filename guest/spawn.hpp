// Starting programs from PID 1.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace agentvm {

// Runs argv (argv[0] is the path) on the console with init's environment, in a session of
// its own with the console as its controlling terminal, so ^C and job control reach it and
// not init. Returns its wait status once it exits, reaping every other child that exits
// meanwhile (PID 1 inherits all orphans). nullopt, after saying why, if it could not start.
std::optional<int> run_on_console(const std::vector<std::string>& argv, const char* cwd);

// Prints "<what> exited <code>" or "<what> killed by signal <n>".
void report_exit(const char* what, int wait_status);

} // namespace agentvm
