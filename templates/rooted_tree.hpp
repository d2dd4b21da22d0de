// Writes into a root filesystem tree that came from an untrusted image. Every path is
// resolved by the kernel as if the tree's root were "/" (openat2 with RESOLVE_IN_ROOT): a
// symlink `/sbin -> /etc` or `../../..` in the image leads back inside the tree, never to
// the host's own files. The last component of a path written is never followed: an image's
// symlink there is replaced, not written through. A directory reached through a symlink whose
// target the tree lacks is not created: that write fails, naming the path.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "common/fd.hpp"

namespace agentvm {

class RootedTree {
public:
    // Opens `root`, a directory on the host. Throws Error.
    explicit RootedTree(const std::filesystem::path& root);

    // mkdir -p of `path` (absolute within the tree); existing directories are kept as they are.
    void make_dirs(const std::string& path, mode_t mode) const;
    // Creates or replaces the file at `path` with `data` (parents created).
    void write_file(const std::string& path, std::string_view data, mode_t mode) const;
    // Copies host file `from` to `path` in the tree (parents created), replacing what is there.
    void copy_file(const std::filesystem::path& from, const std::string& path, mode_t mode) const;
    // Copies a host file or directory tree (recursively; symlinks as symlinks) to `path`:
    // a directory's contents go into `path`, as a Containerfile's COPY does. The host side is
    // the user's own: anything but directories, regular files and symlinks there is refused.
    void copy_in(const std::filesystem::path& from, const std::string& path) const;
    // Creates device node `path` (c, major, minor) unless something is already there.
    void make_char_device(const std::string& path, mode_t mode, unsigned major, unsigned minor) const;
    // Whether `path` exists in the tree (resolved within it).
    bool exists(const std::string& path) const;
    bool is_directory(const std::string& path) const;
    // The regular file at `path` (resolved within the tree), or nullopt when there is none.
    // Throws Error for another failure, something else at `path`, or more than max_bytes.
    std::optional<std::string> read_file(const std::string& path, size_t max_bytes) const;

private:
    // The directory holding `path`'s last component, resolved within the tree, and that
    // component. Throws Error for "/" or a path with "." or ".." as its last component.
    std::pair<Fd, std::string> parent_of(const std::string& path, bool create_parents) const;
    Fd open_dir(const std::string& path) const;
    // parent_of(path), parents created, with whatever the image has at `path` removed.
    std::pair<Fd, std::string> replace(const std::string& path) const;
    // A new file at `path` (parents created, anything there replaced) with exactly `mode`.
    Fd create_file(const std::string& path, mode_t mode) const;

    std::filesystem::path root_path_;
    Fd root_;
};

} // namespace agentvm
