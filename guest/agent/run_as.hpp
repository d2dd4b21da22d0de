// The credentials of every process the agent starts (exec calls, the persistent shell, the
// interpreter): root, or the user a template's image names in its user file
// (protocol/image_defaults.hpp); an exec or spawn call may name another (accounts.hpp). The agent itself stays root: it manages the calls' cgroups,
// serves the host's file operations and kills what it started.
#pragma once

#include <optional>
#include <string>

#include "protocol/image_defaults.hpp"

namespace agentvm {

// Reads the user file once at start-up, before any call runs; an absent file means root.
// Throws Error when the file is there but unreadable or malformed: running the image's
// commands as root instead of the user it names would be a silent change of meaning.
void load_run_as(const char* path);

// The user loaded; nullopt for root.
const std::optional<ImageUser>& run_as();

// In a forked child, async-signal-safe (raw system calls, which change only the calling
// thread: the only one a forked child has): supplementary groups, then real, effective and
// saved gid, then uid. Returns 0 or the errno of the step that failed.
int drop_to(const ImageUser& user);
// drop_to(run_as()), or nothing when calls run as root.
int drop_to_run_as();

// Makes what the agent created for the run-as user (a session's directory and FIFOs, a new
// file of write_file) belong to it; nothing when calls run as root. Returns 0 or the errno.
int hand_over(int fd);
int hand_over(const std::string& path);

} // namespace agentvm
