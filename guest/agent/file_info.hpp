// The stat and list_dir calls, and the fields that describe a file in them (and in move's
// answer): type, size, mode, mtime, owner and group by number and by name, symlink target.
// Both act with the call's user's file credentials (fs_user.hpp).
#pragma once

#include <dirent.h>

#include <memory>
#include <string>

#include "protocol/agent_protocol.hpp"

namespace agentvm {

// Throw CallError (not_found, io).
Json stat_path(const Json& id, const StatRequest& request);
Json list_dir(const Json& id, const ListDirRequest& request);

// The fields of `path` itself (a symlink is described, not followed), with its name and its
// absolute path. Throws CallError (not_found, io).
Json describe_path(const std::string& path);

// `path` made absolute against the agent's working directory, without trailing slashes: how
// answers name a file. Lexical only: symlinks and ".." stay as given.
std::string absolute_path(const std::string& path);

// An open directory stream (the file ops read directories with readdir).
struct CloseDir {
    void operator()(DIR* dir) const { ::closedir(dir); }
};
using DirStream = std::unique_ptr<DIR, CloseDir>;

// CallError for a failed system call on `path`: not_found when it (or a directory on the way)
// does not exist, io with the system's message otherwise.
[[noreturn]] void throw_path_error(const std::string& what, const std::string& path, int error);

} // namespace agentvm
