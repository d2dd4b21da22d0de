#include "guest/agent/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "common/base64.hpp"
#include "common/fd.hpp"
#include "guest/agent/fs_user.hpp"
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

} // namespace

size_t write_file(const WriteFileRequest& request)
{
    // Only a named user: without one the call stays root's, as it always was.
    std::optional<UserFiles> as_user;
    if (request.user)
        as_user.emplace(file_call_user(request.user));
    const int flags = O_WRONLY | O_CLOEXEC | (request.append ? O_APPEND : O_TRUNC);
    // A file this call creates belongs to the named user (made with its credentials), else to
    // the image's (run_as.hpp), as if its commands had written it; an existing file keeps its
    // owner. O_EXCL tells the two apart.
    Fd fd(::open(request.path.c_str(), flags | O_CREAT | O_EXCL, request.mode.value_or(0644)));
    const bool created = static_cast<bool>(fd);
    if (!created && errno == EEXIST)
        fd = Fd(::open(request.path.c_str(), flags));
    if (!fd)
        throw_file_error("open", request.path);
    if (created && !request.user) {
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
    Fd fd;
    {
        // Opening is what the user's rights decide; the reading thread is root's again while
        // the events wait for the peer.
        std::optional<UserFiles> as_user;
        if (request.user)
            as_user.emplace(file_call_user(request.user));
        fd = Fd(::open(request.path.c_str(), O_RDONLY | O_CLOEXEC));
        if (!fd)
            throw_file_error("open", request.path);
    }
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

} // namespace agentvm
