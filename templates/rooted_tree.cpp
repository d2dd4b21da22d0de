#include "templates/rooted_tree.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "common/error.hpp"

namespace agentvm {
namespace {

int openat2_in_root(int root, const std::string& path, uint64_t flags, uint64_t mode)
{
    open_how how{};
    how.flags = flags | O_CLOEXEC;
    how.mode = (flags & O_CREAT) ? mode : 0;
    // Magic links (/proc/self/...) do not exist in an image's tree, but a mount could add them.
    how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
    const std::string relative = path.empty() ? "." : path;
    return static_cast<int>(::syscall(SYS_openat2, root, relative.c_str(), &how, sizeof how));
}

std::string trimmed(const std::string& path)
{
    std::string p = path;
    while (p.size() > 1 && p.back() == '/')
        p.pop_back();
    return p;
}

void write_all(int fd, std::string_view data, const std::string& what)
{
    while (!data.empty()) {
        const ssize_t n = ::write(fd, data.data(), data.size());
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            throw_errno(what);
        data.remove_prefix(static_cast<size_t>(n));
    }
}

} // namespace

RootedTree::RootedTree(const std::filesystem::path& root)
    : root_path_(root), root_(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC))
{
    if (!root_)
        throw_errno(fmt::format("opening the image's root '{}'", root.string()));
}

Fd RootedTree::open_dir(const std::string& path) const
{
    Fd dir(openat2_in_root(root_.get(), path, O_PATH | O_DIRECTORY, 0));
    if (!dir)
        throw_errno(fmt::format("'{}' in the image", path));
    return dir;
}

std::pair<Fd, std::string> RootedTree::parent_of(const std::string& path, bool create_parents) const
{
    const std::string p = trimmed(path);
    if (p.empty() || p.front() != '/')
        throw Error(fmt::format("'{}': a path in the image must be absolute", path));
    const size_t slash = p.rfind('/');
    const std::string leaf = p.substr(slash + 1);
    if (leaf.empty() || leaf == "." || leaf == "..")
        throw Error(fmt::format("'{}': names no file in the image", path));
    const std::string parent = slash == 0 ? "/" : p.substr(0, slash);
    if (create_parents)
        make_dirs(parent, 0755);
    return {open_dir(parent), leaf};
}

void RootedTree::make_dirs(const std::string& path, mode_t mode) const
{
    const std::string p = trimmed(path);
    if (p.empty() || p.front() != '/')
        throw Error(fmt::format("'{}': a path in the image must be absolute", path));
    if (p == "/")
        return;
    // Component by component, each parent resolved within the tree afresh, so that a
    // symlink met on the way is followed inside the tree only.
    size_t end = 0;
    while (end != std::string::npos) {
        end = p.find('/', end + 1);
        const std::string prefix = p.substr(0, end);
        const size_t slash = prefix.rfind('/');
        const std::string leaf = prefix.substr(slash + 1);
        if (leaf.empty() || leaf == "." || leaf == "..")
            continue;
        Fd parent = open_dir(slash == 0 ? "/" : prefix.substr(0, slash));
        if (::mkdirat(parent.get(), leaf.c_str(), mode) != 0 && errno != EEXIST)
            throw_errno(fmt::format("creating '{}' in the image", prefix));
    }
    open_dir(p);  // what exists there must be a directory (or lead to one inside the tree)
}

std::pair<Fd, std::string> RootedTree::replace(const std::string& path) const
{
    auto [parent, leaf] = parent_of(path, true);
    // An image's symlink or file there is replaced, never written through.
    if (::unlinkat(parent.get(), leaf.c_str(), 0) != 0 && errno != ENOENT)
        throw_errno(fmt::format("replacing '{}' in the image", path));
    return {std::move(parent), std::move(leaf)};
}

Fd RootedTree::create_file(const std::string& path, mode_t mode) const
{
    const auto [parent, leaf] = replace(path);
    Fd file(::openat(parent.get(), leaf.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
    if (!file)
        throw_errno(fmt::format("creating '{}' in the image", path));
    if (::fchmod(file.get(), mode) != 0)  // the umask must not narrow it
        throw_errno(fmt::format("chmod '{}' in the image", path));
    return file;
}

void RootedTree::write_file(const std::string& path, std::string_view data, mode_t mode) const
{
    const Fd file = create_file(path, mode);
    write_all(file.get(), data, fmt::format("writing '{}' in the image", path));
}

void RootedTree::copy_file(const std::filesystem::path& from, const std::string& path, mode_t mode) const
{
    Fd source(::open(from.c_str(), O_RDONLY | O_CLOEXEC));
    if (!source)
        throw_errno(fmt::format("reading '{}'", from.string()));
    struct stat st {};
    if (::fstat(source.get(), &st) != 0)
        throw_errno(fmt::format("stat '{}'", from.string()));
    const Fd file = create_file(path, mode);
    for (off_t left = st.st_size; left > 0;) {
        // sendfile, not copy_file_range: the host file and the image are on two filesystems.
        const ssize_t n = ::sendfile(file.get(), source.get(), nullptr, static_cast<size_t>(left));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            throw_errno(fmt::format("copying '{}' to '{}' in the image", from.string(), path));
        if (n == 0)
            throw Error(fmt::format("'{}' shrank while it was copied into the image", from.string()));
        left -= n;
    }
}

void RootedTree::copy_in(const std::filesystem::path& from, const std::string& path) const
{
    struct stat st {};
    if (::lstat(from.c_str(), &st) != 0)
        throw_errno(fmt::format("--copy source '{}'", from.string()));
    const mode_t mode = st.st_mode & 07777;
    if (S_ISREG(st.st_mode)) {
        copy_file(from, path, mode);
    } else if (S_ISLNK(st.st_mode)) {
        std::error_code ec;
        const auto target = std::filesystem::read_symlink(from, ec);
        if (ec)
            throw Error(fmt::format("reading the symlink '{}': {}", from.string(), ec.message()));
        const auto [parent, leaf] = replace(path);
        if (::symlinkat(target.c_str(), parent.get(), leaf.c_str()) != 0)
            throw_errno(fmt::format("creating the symlink '{}' in the image", path));
    } else if (S_ISDIR(st.st_mode)) {
        make_dirs(path, mode);
        std::error_code ec;
        for (const auto& entry : std::filesystem::directory_iterator(from, ec))
            copy_in(entry.path(), trimmed(path) + (trimmed(path) == "/" ? "" : "/") + entry.path().filename().string());
        if (ec)
            throw Error(fmt::format("listing '{}': {}", from.string(), ec.message()));
    } else {
        throw Error(fmt::format("--copy: '{}' is neither a file, a directory nor a symlink", from.string()));
    }
}

void RootedTree::make_char_device(const std::string& path, mode_t mode, unsigned major, unsigned minor) const
{
    auto [parent, leaf] = parent_of(path, true);
    if (::mknodat(parent.get(), leaf.c_str(), S_IFCHR | mode, makedev(major, minor)) != 0 && errno != EEXIST)
        throw_errno(fmt::format("creating the device node '{}' in the image", path));
}

bool RootedTree::exists(const std::string& path) const
{
    Fd found(openat2_in_root(root_.get(), path, O_PATH, 0));
    return static_cast<bool>(found);
}

bool RootedTree::is_directory(const std::string& path) const
{
    Fd found(openat2_in_root(root_.get(), path, O_PATH | O_DIRECTORY, 0));
    return static_cast<bool>(found);
}

std::optional<std::string> RootedTree::read_file(const std::string& path, size_t max_bytes) const
{
    Fd file(openat2_in_root(root_.get(), path, O_RDONLY | O_NONBLOCK, 0));
    if (!file && (errno == ENOENT || errno == ENOTDIR))
        return std::nullopt;
    if (!file)
        throw_errno(fmt::format("opening '{}' in the image", path));
    struct stat st {};
    if (::fstat(file.get(), &st) != 0)
        throw_errno(fmt::format("'{}' in the image", path));
    if (!S_ISREG(st.st_mode))
        throw Error(fmt::format("'{}' in the image is not a regular file", path));
    if (static_cast<uint64_t>(st.st_size) > max_bytes)
        throw Error(fmt::format("'{}' in the image is larger than {} bytes", path, max_bytes));
    std::string text(static_cast<size_t>(st.st_size), '\0');
    size_t done = 0;
    while (done < text.size()) {
        const ssize_t n = ::read(file.get(), text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            throw_errno(fmt::format("reading '{}' in the image", path));
        if (n == 0)
            break;
        done += static_cast<size_t>(n);
    }
    text.resize(done);
    return text;
}

} // namespace agentvm
