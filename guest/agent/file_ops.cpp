#include "guest/agent/file_ops.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <vector>

#include "common/fd.hpp"
#include "guest/agent/file_info.hpp"
#include "guest/agent/fs_user.hpp"

namespace agentvm {

namespace {

// How many subdirectory names a directory being removed keeps in hand; one with more is
// read again once those are gone. Bounds the names held along a deep path.
constexpr size_t max_pending_subdirectories = 256;
// How often a removal finds a directory written to after it emptied it before giving up:
// a process that keeps writing into the tree would otherwise keep the call going.
constexpr int max_refills = 100;
// How much of the path inside a tree an error message quotes.
constexpr size_t max_quoted_path = 512;

std::string without_trailing_slashes(std::string path)
{
    while (path.size() > 1 && path.back() == '/')
        path.pop_back();
    return path;
}

// A directory on the way down a tree being removed. No descriptor is kept for it: the walk
// holds one directory open at a time, however deep the tree, and comes back up through ".."
// checked against the device and inode recorded here.
struct RemovalFrame {
    dev_t dev;
    ino_t ino;
    std::string name;  // in its parent
    std::vector<std::string> subdirectories;  // found, not yet removed
    bool unread = true;  // it may hold entries not seen yet
};

// The directory the walk is in: its descriptor, and a stream on it once it has been read.
class OpenDirectory {
public:
    explicit OpenDirectory(Fd fd) : fd_(std::move(fd)) {}
    int fd() const { return stream_ ? ::dirfd(stream_.get()) : fd_.get(); }
    // The stream from the first entry; nullptr with errno set when it cannot be had.
    DIR* rewound()
    {
        if (stream_) {
            ::rewinddir(stream_.get());
        } else {
            stream_.reset(::fdopendir(fd_.get()));
            if (stream_)
                fd_.release();  // the stream owns it now
        }
        return stream_.get();
    }

private:
    Fd fd_;
    DirStream stream_;
};

// Removes a directory and everything in it, depth first, without recursion (the stack does
// not grow with the tree), following no symlink and crossing no mount point. Costs a few
// system calls a directory: on a deep tree they are most of its time.
class TreeRemoval {
public:
    TreeRemoval(std::string path, const struct stat& top)
        : path_(std::move(path)), dev_(top.st_dev), ino_(top.st_ino)
    {
    }

    // Removes the directory `name` in `parent_fd` (described by `top`). Throws
    // CallError(io), with what was removed before staying removed.
    void remove(int parent_fd, const std::string& name)
    {
        OpenDirectory current(Fd(::openat(parent_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)));
        if (current.fd() < 0)
            fail("open", errno);
        check_same(current.fd(), dev_, ino_, "was replaced during removal");
        frames_.push_back(RemovalFrame{dev_, ino_, name, {}, true});
        for (;;) {
            RemovalFrame& frame = frames_.back();
            if (frame.subdirectories.empty() && frame.unread) {
                frame.unread = read(current, frame);
                continue;
            }
            if (!frame.subdirectories.empty()) {
                std::string child = std::move(frame.subdirectories.back());
                frame.subdirectories.pop_back();
                Fd next(::openat(current.fd(), child.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
                if (!next) {
                    if (errno == ENOENT)
                        continue;  // gone meanwhile
                    if (errno == ELOOP || errno == ENOTDIR) {
                        frame.unread = true;  // replaced by a file or a symlink: removed as one
                        continue;
                    }
                    fail("open", errno, child);
                }
                struct stat st;
                if (::fstat(next.get(), &st) != 0)
                    fail("stat", errno, child);
                if (st.st_dev != dev_)
                    fail_mount(child);
                frames_.push_back(RemovalFrame{st.st_dev, st.st_ino, std::move(child), {}, true});
                current = OpenDirectory(std::move(next));
                continue;
            }
            // Empty, as far as the last pass saw: its parent's rmdir tells.
            if (frames_.size() == 1) {
                if (::unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR) == 0)
                    return;
                refilled(frame);
                continue;
            }
            const std::string done = std::move(frame.name);
            frames_.pop_back();
            OpenDirectory up(Fd(::openat(current.fd(), "..", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)));
            if (up.fd() < 0)
                fail("open ..", errno);
            // Moved elsewhere meanwhile, ".." is no longer the directory we came down from:
            // going on would remove what is beside it there.
            check_same(up.fd(), frames_.back().dev, frames_.back().ino, "was moved during removal");
            current = std::move(up);
            if (::unlinkat(current.fd(), done.c_str(), AT_REMOVEDIR) != 0)
                refilled(frames_.back(), done);
        }
    }

private:
    // Removes every non-directory in the directory and notes up to max_pending_subdirectories
    // subdirectories. Returns whether there were more, to be read again once those are gone.
    bool read(OpenDirectory& directory, RemovalFrame& frame)
    {
        DIR* dir = directory.rewound();
        if (!dir)
            fail("opendir", errno);
        bool more = false;
        for (;;) {
            errno = 0;
            const dirent* entry = ::readdir(dir);
            if (!entry) {
                if (errno != 0)
                    fail("readdir", errno);
                return more;
            }
            const std::string_view name = entry->d_name;
            if (name == "." || name == "..")
                continue;
            bool is_directory = entry->d_type == DT_DIR;
            if (entry->d_type == DT_UNKNOWN) {
                struct stat st;
                if (::fstatat(::dirfd(dir), entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
                    if (errno == ENOENT)
                        continue;
                    fail("stat", errno, std::string(name));
                }
                is_directory = S_ISDIR(st.st_mode);
            }
            // A directory's device is checked as it is entered (a mount point stops the call).
            if (is_directory) {
                if (frame.subdirectories.size() < max_pending_subdirectories)
                    frame.subdirectories.emplace_back(name);
                else
                    more = true;
                continue;
            }
            // A symlink is removed itself, never what it points to.
            if (::unlinkat(::dirfd(dir), entry->d_name, 0) != 0 && errno != ENOENT)
                fail("unlink", errno, std::string(name));
        }
    }

    // The rmdir of `child` in `frame`'s directory (of the frame itself without `child`)
    // failed: written to since it was read, it is read again; any other failure ends the call.
    void refilled(RemovalFrame& frame, const std::string& child = "")
    {
        if (errno == ENOENT && !child.empty())
            return;  // gone meanwhile
        if ((errno != ENOTEMPTY && errno != EEXIST) || refills_left_-- == 0)
            fail("rmdir", errno, child);
        frame.unread = true;
    }

    void check_same(int fd, dev_t dev, ino_t ino, const char* otherwise)
    {
        struct stat st;
        if (::fstat(fd, &st) != 0)
            fail("stat", errno);
        if (st.st_dev != dev || st.st_ino != ino)
            throw CallError("io", "remove " + path_ + ": " + where() + " " + otherwise + "; stopped");
    }

    // Where the walk is, relative to path_, cut to its end when long.
    std::string where(const std::string& child = "") const
    {
        std::string inside;
        for (size_t i = 1; i < frames_.size(); ++i)
            inside += frames_[i].name + "/";
        inside += child;
        if (inside.empty())
            return path_;
        if (inside.size() > max_quoted_path)
            inside = "…" + inside.substr(inside.size() - max_quoted_path);
        return path_ + "/" + inside;
    }

    [[noreturn]] void fail(const char* what, int error, const std::string& child = "")
    {
        throw CallError("io", std::string("remove ") + path_ + ": " + what + " " + where(child) + ": "
                                  + std::strerror(error));
    }

    [[noreturn]] void fail_mount(const std::string& child)
    {
        throw CallError("io", "remove " + path_ + ": " + where(child)
                                  + " is another file system (a mount point): not removed, nor what holds it");
    }

    std::string path_;
    dev_t dev_;  // of the whole tree: a directory on another is a mount point
    ino_t ino_;
    std::vector<RemovalFrame> frames_;
    int refills_left_ = max_refills;
};

} // namespace

Json make_dir(const Json& id, const MakeDirRequest& request)
{
    const UserFiles as_user(file_call_user(request.user));
    const std::string path = without_trailing_slashes(request.path);
    // Each directory on the path from the top, so that a missing parent is made first.
    std::vector<std::string> prefixes;
    for (size_t end = 1; end <= path.size(); ++end)
        if (end == path.size() || (path[end] == '/' && path[end - 1] != '/'))
            prefixes.push_back(path.substr(0, end));

    std::vector<std::string> created;
    for (const std::string& prefix : prefixes) {
        // Owner-only while its own subdirectories are made in it; its mode comes after.
        if (::mkdir(prefix.c_str(), 0700) == 0) {
            created.push_back(prefix);
            continue;
        }
        const int error = errno;
        struct stat st;
        if (error != EEXIST)
            throw_path_error("make_dir", prefix, error);
        if (::stat(prefix.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
            throw CallError("exists", "make_dir " + request.path + ": " + prefix + " exists and is not a directory");
    }
    // Exactly the mode asked for, umask or not; deepest first, so that a mode without search
    // permission on a parent does not stop the chmod of what is in it.
    const uint32_t mode = request.mode.value_or(default_make_dir_mode);
    for (auto it = created.rbegin(); it != created.rend(); ++it)
        if (::chmod(it->c_str(), mode) != 0)
            throw_path_error("chmod", *it, errno);
    return Json{{"id", id}, {"ok", true}, {"created", !created.empty() && created.back() == path}};
}

Json move_path(const Json& id, const MoveRequest& request)
{
    const UserFiles as_user(file_call_user(request.user));
    if (::rename(request.from.c_str(), request.to.c_str()) != 0) {
        const int error = errno;
        const std::string what = "move " + request.from + " to " + request.to;
        if (error == EXDEV)
            throw CallError("io", what + ": they are on different file systems (EXDEV), which rename cannot "
                                         "cross; copy and remove instead");
        if (error == ENOTEMPTY || error == EEXIST)
            throw CallError("not_empty", what + ": " + std::strerror(error));
        // ENOTDIR is also a directory moved onto a file, which is not a missing path.
        struct stat from, to;
        if (error == ENOTDIR && ::lstat(request.from.c_str(), &from) == 0 && S_ISDIR(from.st_mode)
            && ::lstat(request.to.c_str(), &to) == 0 && !S_ISDIR(to.st_mode))
            throw CallError("io", what + ": " + std::strerror(error));
        const bool missing = error == ENOENT || error == ENOTDIR;
        throw CallError(missing ? "not_found" : "io", what + ": " + std::strerror(error));
    }
    return Json{{"id", id}, {"ok", true}, {"entry", describe_path(request.to)}};
}

Json remove_path(const Json& id, const RemoveRequest& request)
{
    const UserFiles as_user(file_call_user(request.user));
    const std::string path = without_trailing_slashes(request.path);
    if (path == "/")
        throw CallError("io", "remove /: refusing to remove the root directory");
    const size_t slash = path.rfind('/');
    const std::string parent_path = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);

    Fd parent_dir(::open(parent_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!parent_dir)
        throw_path_error("remove", request.path, errno);
    struct stat st;
    if (::fstatat(parent_dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
        throw_path_error("remove", request.path, errno);
    if (!S_ISDIR(st.st_mode)) {
        if (::unlinkat(parent_dir.get(), name.c_str(), 0) != 0)
            throw_path_error("remove", request.path, errno);
        return Json{{"id", id}, {"ok", true}};
    }
    if (::unlinkat(parent_dir.get(), name.c_str(), AT_REMOVEDIR) == 0)
        return Json{{"id", id}, {"ok", true}};
    if (errno != ENOTEMPTY && errno != EEXIST)
        throw_path_error("remove", request.path, errno);
    if (!request.recursive)
        throw CallError("not_empty",
                        "remove " + request.path + ": the directory is not empty (\"recursive\":true removes it all)");
    struct stat parent_st;
    if (::fstat(parent_dir.get(), &parent_st) != 0)
        throw_path_error("remove", request.path, errno);
    if (parent_st.st_dev != st.st_dev)
        throw CallError("io", "remove " + request.path + ": it is a mount point: not removed");
    TreeRemoval(request.path, st).remove(parent_dir.get(), name);
    return Json{{"id", id}, {"ok", true}};
}

} // namespace agentvm
