// agentvm: a KVM microVM monitor for AI-agent episodes.
#include <csignal>

#include "cli/command_line.hpp"

int main(int argc, char** argv)
{
    // A reader that goes away (a closed stdout pipe) is an error to report, not a reason to die.
    std::signal(SIGPIPE, SIG_IGN);
    return agentvm::run_command_line(argc, argv);
}
