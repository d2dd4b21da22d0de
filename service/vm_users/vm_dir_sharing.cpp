#include "service/vm_users/vm_dir_sharing.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/fd.hpp"

namespace agentvm {
namespace {

// A snapshot is a directory of files; its outbox holds snapshots. Deeper is not serve's.
constexpr int max_tree_depth = 4;

void take(int dir_fd, const char* name, const struct stat& st, const std::string& shown)
{
    if (st.st_uid == ::geteuid() && st.st_gid == ::getegid())
        return;
    if (::fchownat(dir_fd, name, ::geteuid(), ::getegid(), AT_SYMLINK_NOFOLLOW | (*name ? 0 : AT_EMPTY_PATH)) != 0)
        throw_errno(fmt::format("taking back '{}' from its VM", shown));
}

void reclaim_dir(Fd dir, const std::string& shown, int depth)
{
    if (depth > max_tree_depth)
        throw Error(fmt::format("taking back '{}' from its VM: deeper than any snapshot", shown));
    struct stat st {};
    if (::fstat(dir.get(), &st) != 0)
        throw_errno(fmt::format("taking back '{}' from its VM", shown));
    take(dir.get(), "", st, shown);  // first: the VM can add or rename nothing in it from here on
    Fd listing(::openat(dir.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    DIR* entries = listing ? ::fdopendir(listing.get()) : nullptr;
    if (!entries)
        throw_errno(fmt::format("listing '{}'", shown));
    listing.release();
    struct Closer {
        DIR* entries;
        ~Closer() { ::closedir(entries); }
    } closer{entries};
    while (const dirent* entry = ::readdir(entries)) {
        const std::string name = entry->d_name;
        if (name == "." || name == "..")
            continue;
        const std::string inner = shown + "/" + name;
        if (::fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
            throw_errno(fmt::format("taking back '{}' from its VM", inner));
        if (S_ISDIR(st.st_mode)) {
            Fd child(::openat(dir.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
            if (!child)
                throw_errno(fmt::format("taking back '{}' from its VM", inner));
            reclaim_dir(std::move(child), inner, depth + 1);
        } else {
            take(dir.get(), name.c_str(), st, inner);
        }
    }
}

} // namespace

void reclaim_tree(const std::string& path)
{
    Fd top(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!top) {
        if (errno == ENOENT)
            return;
        throw_errno(fmt::format("taking back '{}' from its VM", path));
    }
    reclaim_dir(std::move(top), path, 0);
}

} // namespace agentvm
