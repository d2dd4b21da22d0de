// The agentvm command line: parses argv into one subcommand and runs it. It lives in the
// command's library rather than in main.cpp so that CLI11, whose header costs seconds of
// compile time in every file that includes it, is compiled with the rest of cli/.
#pragma once

namespace agentvm {

// Returns the process's exit status (episode/exit_codes.hpp).
int run_command_line(int argc, char** argv);

} // namespace agentvm
