#pragma once


#include <functional>

// CLI11 is header-only and slow to compile: only the files that add options include it.
namespace CLI {
class App;
} // namespace CLI

namespace agentvm {

// A parsed subcommand and what runs it; main runs the one the user chose, after logging is set.
struct Subcommand {
    CLI::App* app;
    std::function<int()> run;
    // The exit code for a bad flag or any error of agentvm's own (run: 125, so it cannot be
    // mistaken for the command's status); 0 means the usual ones (2 for usage, 1 otherwise).
    int failure_code = 0;
};

} // namespace agentvm
