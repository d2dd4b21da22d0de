#include "guest/agent/file_watch.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/error.hpp"
#include "guest/agent/file_info.hpp"
#include "guest/agent/fs_user.hpp"

namespace agentvm {

namespace {

// How much of the watch's output may wait in the outbox: past it the watch stops reading
// inotify, and a burst waits in the kernel's queue (which overflows into an "overflow" event
// rather than into the agent's memory).
constexpr size_t watch_queue_limit = size_t{1} << 20;

// IN_CLOSE_WRITE rather than IN_MODIFY: one "write" per file written and closed, not one per
// write() call. IN_EXCL_UNLINK: nothing about a file once it is deleted.
constexpr uint32_t watch_mask = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_CLOSE_WRITE | IN_ATTRIB
                                | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_EXCL_UNLINK;

std::atomic<size_t> running_watches{0};

// One of the max_watches places, for the life of a watch.
class WatchSlot {
public:
    WatchSlot()
    {
        if (running_watches.fetch_add(1) >= max_watches) {
            running_watches.fetch_sub(1);
            throw CallError("limit", "at most " + std::to_string(max_watches)
                                         + " watches run at once in the agent; cancel one first");
        }
    }
    ~WatchSlot() { running_watches.fetch_sub(1); }
    WatchSlot(const WatchSlot&) = delete;
    WatchSlot& operator=(const WatchSlot&) = delete;
};

// A directory below `directory` by a path that must stay inside it: no symlink followed, no
// mount point crossed (a recursive watch keeps to the watched directory's file system, so a
// watch of / does not take in /proc or /sys).
Fd open_beneath(int directory, const std::string& path)
{
    open_how how{};
    how.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV;
    return Fd(static_cast<int>(::syscall(SYS_openat2, directory, path.c_str(), &how, sizeof(how))));
}

std::string join_relative(const std::string& directory, std::string_view name)
{
    return directory.empty() ? std::string(name) : directory + "/" + std::string(name);
}

class DirectoryWatch {
public:
    DirectoryWatch(const Json& id, const WatchRequest& request, Outbox& outbox, int cancel_fd, int requests_ended_fd)
        : id_(id), request_(request), outbox_(outbox), cancel_fd_(cancel_fd), requests_ended_fd_(requests_ended_fd)
    {
    }

    Json run()
    {
        if (!start())
            return ended();
        // From here on every change is seen: the client may rely on that.
        send(Json{{"id", id_}, {"event", "watching"}});

        std::string buffer(64 * 1024, '\0');
        for (;;) {
            pollfd fds[] = {{inotify_.get(), POLLIN, 0}, {cancel_fd_, POLLIN, 0}, {requests_ended_fd_, POLLIN, 0}};
            if (::poll(fds, 3, -1) < 0) {
                if (errno == EINTR)
                    continue;
                throw CallError("io", std::string("watch: poll: ") + std::strerror(errno));
            }
            if (stop_requested())
                return ended();
            const ssize_t n = ::read(inotify_.get(), buffer.data(), buffer.size());
            if (n < 0) {
                if (errno == EAGAIN || errno == EINTR)
                    continue;
                throw CallError("io", std::string("watch: read inotify: ") + std::strerror(errno));
            }
            if (handle_events(std::string_view(buffer.data(), static_cast<size_t>(n))))
                return Json{{"id", id_}, {"ok", true}, {"ended", "removed"}};
        }
    }

private:
    // Watches the directory, and with recursive what is below it. False when a cancel or the
    // end of requests stopped it first.
    bool start()
    {
        // Not kept open: an open descriptor holds off the kernel's IN_DELETE_SELF, by which a
        // watch learns that its directory was removed, until it is closed.
        const Fd root(::open(request_.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        struct stat st;
        if (!root || ::fstat(root.get(), &st) != 0)
            throw_path_error("watch", request_.path, errno);
        root_dev_ = st.st_dev;
        root_ino_ = st.st_ino;
        inotify_ = Fd(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
        if (!inotify_) {
            if (errno == EMFILE)
                throw CallError("limit", "watch " + request_.path + ": the kernel's limit of inotify instances "
                                             "(fs.inotify.max_user_instances) or of the agent's descriptors "
                                             "is reached");
            throw_path_error("watch", request_.path, errno);
        }
        root_wd_ = add_watch(root.get());
        if (root_wd_ < 0) {
            if (errno == ENOSPC)
                throw CallError("limit", "watch " + request_.path + ": the kernel's limit of inotify watches "
                                             "(fs.inotify.max_user_watches) is reached");
            throw_path_error("watch", request_.path, errno);
        }
        nodes_[root_wd_] = Node{-1, "", {}};
        if (!request_.recursive)
            return true;
        starting_ = true;
        const bool walked = walk(root_wd_, false);
        starting_ = false;
        return walked;
    }

    // A watched directory: its place in the tree, by which event names are made relative.
    struct Node {
        int parent_wd;     // -1 for the watched directory
        std::string name;  // in its parent
        std::map<std::string, int> children;
    };

    // Why the watch stopped, as its final response.
    Json ended()
    {
        if (fd_readable(cancel_fd_))
            return Json{{"id", id_}, {"ok", true}, {"ended", "cancelled"}, {"cancelled", true}};
        return Json{{"id", id_}, {"ok", true}, {"ended", "closed"}};
    }

    static bool fd_readable(int fd)
    {
        pollfd pfd{fd, POLLIN, 0};
        return ::poll(&pfd, 1, 0) > 0;
    }

    bool stop_requested() const { return fd_readable(cancel_fd_) || fd_readable(requests_ended_fd_); }

    void send(const Json& line) { outbox_.send_paced(to_line(line), watch_queue_limit); }

    void send_change(const char* type, const std::string& name)
    {
        Json event{{"id", id_}, {"event", "fs"}, {"type", type}};
        put_bytes(event, "name", name);
        send(event);
    }

    void send_overflow() { send(Json{{"id", id_}, {"event", "overflow"}}); }

    // The tree outgrew what the watch may watch: said once, as an overflow, since changes below
    // what is not watched go unseen; at the start it is refused instead.
    void over_limit(const std::string& why)
    {
        if (starting_)
            throw CallError("limit", "watch " + request_.path + ": " + why);
        if (!limit_reported_)
            send_overflow();
        limit_reported_ = true;
    }

    int add_watch(int directory)
    {
        // The descriptor's own path reaches the very directory opened, whatever has been
        // renamed since. /proc/self/fd is open to the agent's threads whatever their fsuid.
        const std::string path = "/proc/self/fd/" + std::to_string(directory);
        return ::inotify_add_watch(inotify_.get(), path.c_str(), watch_mask);
    }

    std::string relative_path(int wd) const
    {
        std::vector<const std::string*> names;
        for (auto it = nodes_.find(wd); it != nodes_.end() && it->second.parent_wd >= 0;
             it = nodes_.find(it->second.parent_wd))
            names.push_back(&it->second.name);
        size_t size = 0;
        for (const std::string* name : names)
            size += name->size() + 1;
        std::string path;
        path.reserve(size);
        for (auto name = names.rbegin(); name != names.rend(); ++name) {
            if (!path.empty())
                path += '/';
            path += **name;
        }
        return path;
    }

    Fd open_node(int wd) const
    {
        Fd root(::open(request_.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        struct stat st;
        if (!root || ::fstat(root.get(), &st) != 0 || st.st_dev != root_dev_ || st.st_ino != root_ino_)
            return Fd();  // gone or replaced: its own events end the watch
        if (wd == root_wd_)
            return root;
        return open_beneath(root.get(), relative_path(wd));
    }

    // Watches the subdirectory `name` of the watched `parent_wd` (open as `parent_fd`, at
    // `parent_path`); its wd, or -1 when it is not (now) watched: gone, a symlink, a mount
    // point, unreadable, or over a limit.
    int add_child(int parent_wd, int parent_fd, const std::string& parent_path, const std::string& name)
    {
        if (nodes_.size() >= max_watched_directories) {
            over_limit("it has more than " + std::to_string(max_watched_directories)
                       + " directories, what one recursive watch may watch; watch a part of it, or "
                         "without \"recursive\"");
            return -1;
        }
        // Reopened later by this path: the kernel takes paths of up to PATH_MAX bytes, the NUL
        // included.
        if (parent_path.size() + 1 + name.size() + 1 > PATH_MAX) {
            over_limit("a directory in it is deeper than a path of " + std::to_string(PATH_MAX) + " bytes");
            return -1;
        }
        const Fd child = open_beneath(parent_fd, name);
        if (!child)
            return -1;
        const int wd = add_watch(child.get());
        if (wd < 0) {
            if (errno == ENOSPC)
                over_limit("the kernel's limit of inotify watches (fs.inotify.max_user_watches) is reached");
            return -1;
        }
        if (nodes_.contains(wd))
            return -1;  // watched already: a scan found it before its own event came
        nodes_[wd] = Node{parent_wd, name, {}};
        nodes_[parent_wd].children[name] = wd;
        return wd;
    }

    // Watches the subdirectories below the watched `first`, breadth first; with `report`, a
    // "create" for each entry found (they may predate the watch of their directory, so no
    // event of theirs came). False when a cancel or the end of requests stopped it.
    bool walk(int first, bool report)
    {
        std::deque<int> pending{first};
        while (!pending.empty()) {
            if (stop_requested())
                return false;
            const int wd = pending.front();
            pending.pop_front();
            if (!nodes_.contains(wd))
                continue;  // forgotten meanwhile
            Fd fd = open_node(wd);
            if (!fd)
                continue;
            DirStream dir(::fdopendir(fd.get()));
            if (!dir)
                continue;
            fd.release();
            const std::string directory = relative_path(wd);
            while (const dirent* entry = ::readdir(dir.get())) {
                const std::string name = entry->d_name;
                if (name == "." || name == "..")
                    continue;
                if (report)
                    send_change("create", join_relative(directory, name));
                bool is_directory = entry->d_type == DT_DIR;
                if (entry->d_type == DT_UNKNOWN) {
                    struct stat st;
                    is_directory = ::fstatat(::dirfd(dir.get()), entry->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0
                                   && S_ISDIR(st.st_mode);
                }
                if (!is_directory)
                    continue;
                if (const int child = add_child(wd, ::dirfd(dir.get()), directory, name); child >= 0)
                    pending.push_back(child);
            }
        }
        return true;
    }

    // A directory appeared in the watched `parent_wd`: watched, with what it already holds.
    void watch_new(int parent_wd, const std::string& name)
    {
        const Fd parent_fd = open_node(parent_wd);
        if (!parent_fd)
            return;
        if (const int wd = add_child(parent_wd, parent_fd.get(), relative_path(parent_wd), name); wd >= 0)
            walk(wd, true);
    }

    // A watched directory and what is below it, once gone from the tree (deleted, or moved
    // out: its watches would go on reporting from wherever it went).
    void forget(int wd)
    {
        const auto it = nodes_.find(wd);
        if (it == nodes_.end())
            return;
        if (const auto parent_node = nodes_.find(it->second.parent_wd); parent_node != nodes_.end())
            parent_node->second.children.erase(it->second.name);
        std::vector<int> doomed{wd};
        while (!doomed.empty()) {
            const int next = doomed.back();
            doomed.pop_back();
            const auto node = nodes_.find(next);
            if (node == nodes_.end())
                continue;
            for (const auto& [name, child] : node->second.children)
                doomed.push_back(child);
            // Fails harmlessly for a watch the kernel already dropped (IN_IGNORED).
            ::inotify_rm_watch(inotify_.get(), next);
            nodes_.erase(node);
        }
    }

    // True when the watched directory is gone.
    bool handle_events(std::string_view bytes)
    {
        while (bytes.size() >= sizeof(inotify_event)) {
            inotify_event event;
            std::memcpy(&event, bytes.data(), sizeof(event));
            const size_t size = sizeof(inotify_event) + event.len;
            if (size > bytes.size())
                break;  // the kernel hands out whole events; this cannot happen
            const std::string name(bytes.data() + sizeof(event), ::strnlen(bytes.data() + sizeof(event), event.len));
            bytes.remove_prefix(size);

            if (event.mask & IN_Q_OVERFLOW) {
                send_overflow();
                continue;
            }
            if (event.wd == root_wd_ && (event.mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT)))
                return true;
            if (event.mask & IN_IGNORED) {
                forget(event.wd);
                continue;
            }
            // A subdirectory's own events (no name) come from its parent too, with its name.
            if (name.empty() || !nodes_.contains(event.wd))
                continue;
            const std::string relative = join_relative(relative_path(event.wd), name);
            const bool is_directory = event.mask & IN_ISDIR;
            if (event.mask & (IN_CREATE | IN_MOVED_TO)) {
                send_change("create", relative);
                if (is_directory && request_.recursive)
                    watch_new(event.wd, name);
            }
            if (event.mask & (IN_DELETE | IN_MOVED_FROM)) {
                send_change("remove", relative);
                if (is_directory)
                    if (const auto child = nodes_[event.wd].children.find(name);
                        child != nodes_[event.wd].children.end())
                        forget(child->second);
            }
            if (event.mask & IN_CLOSE_WRITE)
                send_change("write", relative);
            if (event.mask & IN_ATTRIB)
                send_change("chmod", relative);
        }
        return false;
    }

    const Json& id_;
    const WatchRequest& request_;
    Outbox& outbox_;
    int cancel_fd_;
    int requests_ended_fd_;
    dev_t root_dev_ = 0;  // the watched directory, found again by its path when needed
    ino_t root_ino_ = 0;
    Fd inotify_;  // closing it drops every watch
    int root_wd_ = -1;
    std::unordered_map<int, Node> nodes_;
    bool starting_ = false;
    bool limit_reported_ = false;
};

} // namespace

EndOfRequests::EndOfRequests() : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK))
{
    if (!fd_)
        throw_errno("eventfd");
}

void EndOfRequests::signal()
{
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(fd_.get(), &one, sizeof(one));
}

Json run_watch(const Json& id, const WatchRequest& request, Outbox& outbox, int cancel_fd, int requests_ended_fd)
{
    const WatchSlot slot;
    const UserFiles as_user(file_call_user(request.user));
    return DirectoryWatch(id, request, outbox, cancel_fd, requests_ended_fd).run();
}

} // namespace agentvm
