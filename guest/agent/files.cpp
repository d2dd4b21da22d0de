#include "guest/agent/files.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <queue>
#include <vector>

#include "common/base64.hpp"
#include "common/fd.hpp"
#include "guest/agent/run_as.hpp"

namespace agentvm {

namespace {

// How much read_file lets pile up in the outbox before it waits for the peer.
constexpr size_t read_file_queue_limit = 4 * read_chunk_bytes;

[[noreturn]] void throw_file_error(const std::string& what, const std::string& path)
{
    const int err = errno;
    const bool missing = err == ENOENT || err == ENOTDIR;
    throw CallError(missing ? "not_found" : "io", what + " " + path + ": " + std::strerror(err));
}

const char* type_name(mode_t mode)
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

double seconds(const timespec& t)
{
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

struct DirCloser {
    void operator()(DIR* dir) const { ::closedir(dir); }
};

} // namespace

size_t write_file(const WriteFileRequest& request)
{
    const int flags = O_WRONLY | O_CLOEXEC | (request.append ? O_APPEND : O_TRUNC);
    // A file this call creates belongs to the image's user (run_as.hpp), as if its commands
    // had written it; an existing file keeps its owner. O_EXCL tells the two apart.
    Fd fd(::open(request.path.c_str(), flags | O_CREAT | O_EXCL, request.mode.value_or(0644)));
    const bool created = static_cast<bool>(fd);
    if (!created && errno == EEXIST)
        fd = Fd(::open(request.path.c_str(), flags));
    if (!fd)
        throw_file_error("open", request.path);
    if (created) {
        if (const int error = hand_over(fd.get()); error != 0) {
            errno = error;
            throw_file_error("chown", request.path);
        }
    }
    // open() applies the mode only to a new file, and through the umask; the caller asked
    // for exactly this mode.
    if (request.mode && ::fchmod(fd.get(), *request.mode) != 0)
        throw_file_error("chmod", request.path);
    for (size_t done = 0; done < request.data.size();) {
        const ssize_t n = ::write(fd.get(), request.data.data() + done, request.data.size() - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            throw_file_error("write", request.path);
        done += static_cast<size_t>(n);
    }
    if (::close(fd.release()) != 0)
        throw_file_error("close", request.path);
    return request.data.size();
}

Json read_file(const Json& id, const ReadFileRequest& request, Outbox& outbox)
{
    Fd fd(::open(request.path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd)
        throw_file_error("open", request.path);
    struct stat st;
    if (::fstat(fd.get(), &st) != 0)
        throw_file_error("stat", request.path);
    if (S_ISDIR(st.st_mode)) {
        errno = EISDIR;
        throw_file_error("read", request.path);
    }

    std::string chunk(read_chunk_bytes, '\0');
    uint64_t offset = 0;
    for (;;) {
        // Fill whole chunks so events stay at 1 MiB even from pipes and short reads.
        size_t filled = 0;
        while (filled < chunk.size()) {
            const ssize_t n = ::read(fd.get(), chunk.data() + filled, chunk.size() - filled);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0)
                throw_file_error("read", request.path);
            if (n == 0)
                break;
            filled += static_cast<size_t>(n);
        }
        if (filled == 0)
            break;
        // Files are bytes: read_file always uses data_b64, whatever the content.
        Json event{{"id", id}, {"event", "data"}, {"offset", offset},
            {"data_b64", base64_encode({chunk.data(), filled})}};
        outbox.send_paced(to_line(event), read_file_queue_limit);
        offset += filled;
        if (filled < chunk.size())
            break;
    }
    return Json{{"id", id}, {"ok", true}, {"size", offset}, {"mode", format_mode(st.st_mode)}};
}

Json stat_path(const Json& id, const StatRequest& request)
{
    struct stat st;
    if (::stat(request.path.c_str(), &st) != 0)
        throw_file_error("stat", request.path);
    return Json{{"id", id}, {"ok", true}, {"type", type_name(st.st_mode)}, {"size", st.st_size},
                {"mode", format_mode(st.st_mode)}, {"mtime", seconds(st.st_mtim)}};
}

Json list_dir(const Json& id, const ListDirRequest& request)
{
    Fd fd(::open(request.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd)
        throw_file_error("open", request.path);
    std::unique_ptr<DIR, DirCloser> dir(::fdopendir(fd.get()));
    if (!dir)
        throw_file_error("opendir", request.path);
    fd.release();  // the DIR owns it now

    // The first max_entries names in sorted order, whatever the directory's internal order:
    // a max-heap of the smallest names seen so far, so a directory of millions of entries
    // costs the agent max_entries names, not all of them.
    std::priority_queue<std::string> smallest;
    bool truncated = false;
    for (;;) {
        errno = 0;
        const dirent* entry = ::readdir(dir.get());
        if (!entry) {
            if (errno != 0)
                throw_file_error("readdir", request.path);
            break;
        }
        const std::string_view name = entry->d_name;
        if (name == "." || name == "..")
            continue;
        if (smallest.size() < request.max_entries) {
            smallest.emplace(name);
        } else {
            truncated = true;
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
    std::reverse(names.begin(), names.end());

    Json entries = Json::array();
    for (std::string& name : names) {
        struct stat st;
        // The entry may go between readdir and here: it is simply left out.
        if (::fstatat(::dirfd(dir.get()), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        Json entry = Json::object();
        put_bytes(entry, "name", std::move(name));
        entry["type"] = type_name(st.st_mode);
        entry["size"] = st.st_size;
        entry["mode"] = format_mode(st.st_mode);
        entries.push_back(std::move(entry));
    }
    return Json{{"id", id}, {"ok", true}, {"entries", std::move(entries)}, {"truncated", truncated}};
}

} // namespace agentvm
