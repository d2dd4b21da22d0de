// Starting programs from PID 1.
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace agentvm {

// Every other child init reaps while it waits, with its wait status.
using ReapedChild = std::function<void(pid_t pid, int wait_status)>;

// Runs argv (argv[0] is the path) on the console with init's environment, in a session of
// its own with the console as its controlling terminal, so ^C and job control reach it and
// not init. Returns its wait status once it exits, reaping every other child that exits
// meanwhile (PID 1 inherits all orphans) and telling on_reaped. nullopt, after saying why,
// if it could not start.
std::optional<int> run_on_console(const std::vector<std::string>& argv, const char* cwd,
                                  const ReapedChild& on_reaped);

// Reaps children, telling on_reaped, for as long as keep_going() holds after each one.
void reap_while(const std::function<bool()>& keep_going, const ReapedChild& on_reaped);

// Starts argv in the background in a session of its own, stdin from /dev/null, output on the
// console, with the given oom_score_adj (-1000 to 1000) set before it runs. Returns its pid,
// or -1 after saying why.
pid_t start_daemon(const std::vector<std::string>& argv, const char* cwd, int oom_score_adj);

// Prints "<what> exited <code>" or "<what> killed by signal <n>".
void report_exit(const char* what, int wait_status);

} // namespace agentvm
