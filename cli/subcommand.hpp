#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace agentvm {

// A parsed subcommand and what runs it; main runs the one the user chose, after logging is set.
struct Subcommand {
    CLI::App* app;
    std::function<int()> run;
};

} // namespace agentvm
