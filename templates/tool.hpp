// Runs the well-kept tools a template build stands on (skopeo, umoci, buildah, mkfs.ext4,
// mount), so that agentvm never re-implements image transports, layer unpacking or ext4.
// A tool's failure becomes one Error naming the step and showing the end of what it said.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace agentvm {

struct ToolOptions {
    // What the step is, for messages: "unpacking the image's layers (umoci)".
    std::string what;
    // stdout beyond this fails the step: a tool's answer we parse is small.
    size_t max_stdout = 16 * 1024 * 1024;
    // Whether the tool's stderr goes on to ours as it comes (long steps whose progress the
    // user should see: a Containerfile build); otherwise only its tail, on failure.
    bool show_stderr = false;
    // A tool that hangs (a stuck mount, a wedged buildah) is killed, its process group with
    // it, and the step fails saying so.
    std::chrono::seconds timeout{1800};
};

// Runs argv (argv[0] searched in PATH, in a process group of its own) with stdin /dev/null
// and returns its stdout. Throws Error when it cannot start, is killed, runs past its timeout,
// exits non-zero or says too much on stdout.
std::string run_tool(const std::vector<std::string>& argv, const ToolOptions& options);

// Throws Error naming the Debian package to install for each of `tools` not in PATH.
void require_tools(const std::vector<std::pair<std::string, std::string>>& tool_and_package);

} // namespace agentvm
