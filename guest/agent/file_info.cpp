#include "guest/agent/file_info.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <string_view>
#include <vector>

#include "common/fd.hpp"
#include "guest/agent/accounts.hpp"
#include "guest/agent/fs_user.hpp"
#include "protocol/utf8.hpp"

namespace agentvm {

namespace {

const char* file_type_name(mode_t mode)
{
    switch (mode & S_IFMT) {
    case S_IFREG:
        return "file";
    case S_IFDIR:
        return "dir";
    case S_IFLNK:
        return "symlink";
    case S_IFIFO:
        return "fifo";
    case S_IFSOCK:
        return "socket";
    case S_IFCHR:
        return "char";
    default:
        return "block";
    }
}

double epoch_seconds(const timespec& t)
{
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

std::string join_path(const std::string& directory, const std::string& name)
{
    return directory == "/" ? "/" + name : directory + "/" + name;
}

std::string last_component(const std::string& absolute)
{
    return absolute == "/" ? absolute : absolute.substr(absolute.rfind('/') + 1);
}

// The target of the symlink `name` in `directory`; nullopt when it cannot be read (it went).
std::optional<std::string> link_target(int directory, const char* name)
{
    // Linux keeps a target shorter than PATH_MAX: one byte more tells a cut one apart.
    std::string target(PATH_MAX + 1, '\0');
    const ssize_t n = ::readlinkat(directory, name, target.data(), target.size());
    if (n < 0)
        return std::nullopt;
    target.resize(static_cast<size_t>(n));
    return target;
}

// The fields every description of a file has; `directory` and `name` find it for readlink.
void put_file_fields(Json& entry, const struct stat& st, AccountNames& accounts, int directory, const char* name)
{
    entry["type"] = file_type_name(st.st_mode);
    entry["size"] = st.st_size;
    entry["mode"] = format_mode(st.st_mode);
    entry["mtime"] = epoch_seconds(st.st_mtim);
    entry["uid"] = st.st_uid;
    entry["gid"] = st.st_gid;
    entry["owner"] = accounts.owner(st.st_uid);
    entry["group"] = accounts.group(st.st_gid);
    if (S_ISLNK(st.st_mode))
        if (std::optional<std::string> target = link_target(directory, name))
            put_bytes(entry, "symlink_target", std::move(*target));
}

// A directory's smallest `keep` names (bytewise), largest first so that the smallest is at the
// back: a max-heap of the smallest seen so far, so a directory of millions of entries costs
// `keep` names, not all of them. `more`: it has more than that.
std::vector<std::string> smallest_names(DIR* dir, size_t keep, bool& more, const std::string& path)
{
    std::priority_queue<std::string> smallest;
    for (;;) {
        errno = 0;
        const dirent* entry = ::readdir(dir);
        if (!entry) {
            if (errno != 0)
                throw_path_error("readdir", path, errno);
            break;
        }
        const std::string_view name = entry->d_name;
        if (name == "." || name == "..")
            continue;
        if (smallest.size() < keep) {
            smallest.emplace(name);
        } else {
            more = true;
            if (name < smallest.top()) {
                smallest.pop();
                smallest.emplace(name);
            }
        }
    }
    std::vector<std::string> names;
    names.reserve(smallest.size());
    for (; !smallest.empty(); smallest.pop())
        names.push_back(smallest.top());
    return names;
}

// One directory of a list_dir walk, open while its names are listed.
struct ListLevel {
    DirStream dir;
    std::string prefix;  // its path relative to the listed directory, with a '/'; "" at the top
    uint32_t depth;      // 1: the listed directory
    std::vector<std::string> names;  // still to list, largest first
};

// Names come out deepest level first, each level in order, so the names listed last are the
// largest of the shallowest levels: past `budget` names in all they would never be listed, and
// are dropped. This keeps the walk's memory at max_entries names whatever the depth.
bool trim_pending(std::vector<ListLevel>& levels, size_t budget)
{
    size_t total = 0;
    for (const ListLevel& level : levels)
        total += level.names.size();
    bool dropped = false;
    for (ListLevel& level : levels) {
        if (total <= budget)
            break;
        const size_t drop = std::min(total - budget, level.names.size());
        level.names.erase(level.names.begin(), level.names.begin() + static_cast<std::ptrdiff_t>(drop));
        total -= drop;
        dropped = dropped || drop > 0;
    }
    return dropped;
}

} // namespace

[[noreturn]] void throw_path_error(const std::string& what, const std::string& path, int error)
{
    const bool missing = error == ENOENT || error == ENOTDIR;
    throw CallError(missing ? "not_found" : "io", what + " " + path + ": " + std::strerror(error));
}

std::string absolute_path(const std::string& path)
{
    std::string absolute = path;
    if (absolute.empty() || absolute.front() != '/') {
        std::unique_ptr<char, decltype(&std::free)> cwd(::getcwd(nullptr, 0), &std::free);
        absolute = join_path(cwd ? cwd.get() : "/", absolute);
    }
    while (absolute.size() > 1 && absolute.back() == '/')
        absolute.pop_back();
    return absolute;
}

Json stat_path(const Json& id, const StatRequest& request)
{
    const UserFiles as_user(file_call_user(request.user));
    AccountNames accounts;
    struct stat st;
    if (::stat(request.path.c_str(), &st) != 0)
        throw_path_error("stat", request.path, errno);
    const std::string absolute = absolute_path(request.path);
    Json answer{{"id", id}, {"ok", true}};
    put_bytes(answer, "name", last_component(absolute));
    put_bytes(answer, "path", absolute);
    put_file_fields(answer, st, accounts, AT_FDCWD, request.path.c_str());
    // stat follows a symlink; the link itself still says where it points.
    struct stat link;
    if (::lstat(request.path.c_str(), &link) == 0 && S_ISLNK(link.st_mode))
        if (std::optional<std::string> target = link_target(AT_FDCWD, request.path.c_str()))
            put_bytes(answer, "symlink_target", std::move(*target));
    return answer;
}

Json describe_path(const std::string& path)
{
    AccountNames accounts;
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0)
        throw_path_error("stat", path, errno);
    const std::string absolute = absolute_path(path);
    Json entry = Json::object();
    put_bytes(entry, "name", last_component(absolute));
    put_bytes(entry, "path", absolute);
    put_file_fields(entry, st, accounts, AT_FDCWD, path.c_str());
    return entry;
}

Json list_dir(const Json& id, const ListDirRequest& request)
{
    const UserFiles as_user(file_call_user(request.user));
    Fd fd(::open(request.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd)
        throw_path_error("open", request.path, errno);
    DirStream top(::fdopendir(fd.get()));
    if (!top)
        throw_path_error("opendir", request.path, errno);
    fd.release();  // the DIR owns it now

    const std::string base = absolute_path(request.path);
    const size_t max = request.max_entries;
    AccountNames accounts;
    bool truncated = false;
    size_t listed = 0;
    Json entries = Json::array();
    std::vector<ListLevel> levels;
    {
        // One name more than can be listed: finding it is what says "truncated".
        std::vector<std::string> names = smallest_names(top.get(), max + 1, truncated, request.path);
        levels.push_back(ListLevel{std::move(top), "", 1, std::move(names)});
    }
    while (!levels.empty()) {
        ListLevel& level = levels.back();
        if (level.names.empty()) {
            levels.pop_back();
            continue;
        }
        std::string name = std::move(level.names.back());
        level.names.pop_back();
        const int directory = ::dirfd(level.dir.get());
        struct stat st;
        // The entry may go between readdir and here: it is simply left out.
        if (::fstatat(directory, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (listed == max) {
            truncated = true;
            break;
        }
        const std::string relative = level.prefix + name;
        Json entry = Json::object();
        put_bytes(entry, "name", relative);
        put_bytes(entry, "path", join_path(base, relative));
        put_file_fields(entry, st, accounts, directory, name.c_str());
        entries.push_back(std::move(entry));
        ++listed;

        if (!S_ISDIR(st.st_mode) || level.depth >= request.depth)
            continue;
        // O_NOFOLLOW: a symlink put in the directory's place since the fstatat is not followed.
        Fd sub_fd(::openat(directory, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!sub_fd)
            continue;  // unreadable (permission) or gone: listed, not descended into
        DirStream sub(::fdopendir(sub_fd.get()));
        if (!sub)
            continue;
        sub_fd.release();
        const size_t budget = max - listed + 1;
        std::vector<std::string> names = smallest_names(sub.get(), budget, truncated, join_path(base, relative));
        const uint32_t depth = level.depth + 1;
        levels.push_back(ListLevel{std::move(sub), relative + "/", depth, std::move(names)});
        if (trim_pending(levels, budget))
            truncated = true;
    }
    return Json{{"id", id}, {"ok", true}, {"entries", std::move(entries)}, {"truncated", truncated}};
}

} // namespace agentvm
