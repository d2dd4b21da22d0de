#include "vmm/vsock_host.hpp"

#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "common/whole_number.hpp"

namespace agentvm {
namespace {

// "CONNECT 4294967295\n" is 19 bytes; a client that sends more without a newline is not
// speaking the protocol.
constexpr size_t max_connect_line = 32;
constexpr size_t read_chunk = vsock_max_payload;
// Descriptors kept out of the guest's reach (see stream_cap), half the limit when the limit
// itself is lower: besides its streams an episode's VMM holds about 25 (one more per vCPU).
constexpr uint64_t fd_reserve = 256;
// How long host clients wait in the listener's backlog when no descriptor is to be had.
constexpr std::chrono::milliseconds accept_retry_delay{100};

sockaddr_un unix_address(const std::string& path)
{
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof(addr.sun_path))
        throw Error(fmt::format("vsock socket path '{}' is longer than {} bytes", path,
                                sizeof(addr.sun_path) - 1));
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    return addr;
}

Fd unix_stream_socket()
{
    return Fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
}

std::optional<uint32_t> parse_connect_line(std::string_view line)
{
    constexpr std::string_view verb = "CONNECT ";
    if (line.substr(0, verb.size()) != verb)
        return std::nullopt;
    line.remove_prefix(verb.size());
    return whole_number<uint32_t>(line);
}

} // namespace

struct VsockHost::Stream {
    enum class Phase { handshake, connecting, relaying };

    Fd fd;
    VsockConnId id{};
    Phase phase = Phase::handshake;
    bool closed = false;
    bool detached = false;               // the device dropped the connection; flush and close

    std::vector<uint8_t> line;           // the CONNECT line, as far as it has arrived
    std::array<uint8_t, read_chunk> in{};  // host -> guest
    iovec in_iov{};
    bool reading = false;
    bool read_paused = false;            // waiting for the device to have room again

    std::deque<uint8_t> out;             // guest -> host, not yet written
    std::vector<uint8_t> out_batch;      // the bytes of the write in flight
    iovec out_iov{};
    bool writing = false;
    bool shut_write_when_flushed = false;
    size_t own_bytes = 0;                // head of `out` that is our "OK" line, not guest data
};

VsockHost::VsockHost(EventLoop& loop, std::optional<std::string> path)
    : loop_(loop), path_(std::move(path))
{
    update_stream_cap();
    reset_wake_ = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!reset_wake_)
        throw_errno("eventfd for vsock driver resets");
    loop_.watch_readable(reset_wake_.get(), [this] {
        uint64_t count = 0;
        if (::read(reset_wake_.get(), &count, sizeof(count)) == sizeof(count))
            close_reset_streams();
    });
    if (!path_)
        return;
    const sockaddr_un addr = unix_address(*path_);
    listener_ = unix_stream_socket();
    if (!listener_)
        throw_errno("creating a Unix socket for vsock");
    if (::bind(listener_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0)
        throw_errno(fmt::format("cannot listen for vsock connections at '{}'", *path_));
    if (::listen(listener_.get(), 64) != 0)
        throw_errno(fmt::format("listen on '{}'", *path_));
    accept_retry_.emplace(loop_, [this] { watch_listener(); });
    watch_listener();
}

void VsockHost::watch_listener()
{
    if (!closing_)
        loop_.watch_readable(listener_.get(), [this] { accept_clients(); });
}

VsockHost::~VsockHost()
{
    loop_.unwatch(reset_wake_.get());
    if (listener_) {
        loop_.unwatch(listener_.get());
        ::unlink(path_->c_str());
    }
}

void VsockHost::close_all()
{
    if (listener_) {
        loop_.unwatch(listener_.get());
        accept_retry_->cancel();
    }
    std::unique_lock<std::recursive_mutex> lock;
    if (device_)
        lock = std::unique_lock(device_->mutex());
    closing_ = true;
    // Not only the device's connections: a host client still sending its CONNECT line, or
    // a stream flushing the guest's last bytes to a host that does not read, has I/O in
    // flight too.
    for (const auto& weak : sockets_) {
        if (const StreamPtr s = weak.lock()) {
            s->closed = true;
            ::shutdown(s->fd.get(), SHUT_RDWR);  // completes any read or write in flight
        }
    }
    sockets_.clear();
    streams_.clear();
    reset_streams_.clear();
}

size_t VsockHost::open_streams()
{
    std::erase_if(sockets_, [](const std::weak_ptr<Stream>& s) { return s.expired(); });
    return sockets_.size();
}

size_t VsockHost::stream_cap_for(uint64_t soft_limit)
{
    return soft_limit - std::min<uint64_t>(fd_reserve, soft_limit / 2);
}

void VsockHost::update_stream_cap()
{
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) != 0)
        throw_errno("getrlimit(RLIMIT_NOFILE)");
    // No limit: the device's own cap on connections is the only one.
    stream_cap_ = limit.rlim_cur == RLIM_INFINITY ? VirtioVsock::max_connections : stream_cap_for(limit.rlim_cur);
}

VsockHost::StreamPtr VsockHost::new_stream(Fd fd)
{
    auto s = std::make_shared<Stream>();
    s->fd = std::move(fd);
    if (sockets_.size() >= prune_at_)
        prune_at_ = std::max<size_t>(64, 2 * open_streams());
    sockets_.push_back(s);
    return s;
}

void VsockHost::accept_clients()
{
    for (;;) {
        if (sockets_.size() >= stream_cap_ && open_streams() >= stream_cap_) {
            pause_accepting(fmt::format("{} streams open, the most the descriptor limit allows", stream_cap_));
            return;
        }
        Fd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (!fd) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                pause_accepting(std::strerror(errno));
            else if (errno == ECONNABORTED)
                continue;
            else if (errno != EAGAIN && errno != EINTR)
                spdlog::warn("vsock: accept on '{}' failed: {}", *path_, std::strerror(errno));
            return;
        }
        accept_paused_ = false;
        read_connect_line(new_stream(std::move(fd)));
    }
}

void VsockHost::pause_accepting(const std::string& why)
{
    // The listener stays readable while clients wait in its backlog: watching it now would
    // spin the loop until a descriptor frees up. The clients wait there instead.
    loop_.unwatch(listener_.get());
    if (!accept_paused_)
        spdlog::warn("vsock: not accepting host clients at '{}' for now: {}", *path_, why);
    accept_paused_ = true;
    accept_retry_->arm(accept_retry_delay);
}

void VsockHost::read_connect_line(const StreamPtr& s)
{
    // One byte at a time: whatever follows the newline is stream data and must stay in the
    // socket for the relay to read.
    s->in_iov = {s->in.data(), 1};
    loop_.readv(s->fd.get(), &s->in_iov, 1, 0, [this, s](int32_t res) {
        if (res <= 0 || s->closed)
            return;
        const uint8_t byte = s->in[0];
        if (byte != '\n') {
            s->line.push_back(byte);
            if (s->line.size() > max_connect_line) {
                spdlog::warn("vsock: a client at '{}' sent no CONNECT line; closing it", *path_);
                return;
            }
            read_connect_line(s);
            return;
        }
        const std::string_view text(reinterpret_cast<const char*>(s->line.data()), s->line.size());
        const auto port = parse_connect_line(text);
        std::lock_guard lock(device_->mutex());
        if (!port) {
            spdlog::warn("vsock: bad handshake '{}' at '{}'; closing it", text, *path_);
            return;
        }
        start_connect(s, *port);
    });
}

Fd VsockHost::connect_internal(uint32_t port)
{
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, fds) != 0)
        throw_errno("socketpair for an internal vsock connection");
    Fd theirs(fds[1]);
    const StreamPtr s = new_stream(Fd(fds[0]));
    std::lock_guard lock(device_->mutex());
    start_connect(s, port);
    return theirs;
}

void VsockHost::start_connect(const StreamPtr& s, uint32_t port)
{
    s->id = {next_host_port_++, port};
    s->phase = Stream::Phase::connecting;
    streams_[s->id] = s;
    if (closing_ || !device_->connect(s->id)) {
        // Dropping the stream closes our end: the client reads end-of-file, as for a refusal.
        streams_.erase(s->id);
        spdlog::debug("vsock: guest cannot take a connection to port {} now", port);
    }
}

bool VsockHost::on_connect_request(VsockConnId id)
{
    if (!path_ || closing_ || streams_.count(id))
        return false;
    const size_t open = open_streams();
    if (open >= stream_cap_) {
        guest_warn(warn_, "vsock: refusing guest port {} -> host port {}: {} host sockets open, at most {} "
                   "within the descriptor limit", id.guest_port, id.host_port, open, stream_cap_);
        return false;
    }
    const std::string target = fmt::format("{}_{}", *path_, id.host_port);
    if (target.size() >= sizeof(sockaddr_un::sun_path)) {
        guest_warn(warn_, "vsock: refusing guest port {} -> host port {}: '{}' is too long for a Unix socket path",
                   id.guest_port, id.host_port, target);
        return false;
    }
    const sockaddr_un addr = unix_address(target);
    Fd fd = unix_stream_socket();
    if (!fd) {
        // EMFILE or ENFILE (descriptors the cap did not foresee), ENOMEM, ENOBUFS: the guest
        // is refused, the VM goes on.
        guest_warn(warn_, "vsock: refusing guest port {} -> host port {}: no socket: {}", id.guest_port,
                   id.host_port, std::strerror(errno));
        return false;
    }
    // A Unix socket connect completes at once or fails at once (EAGAIN: backlog full).
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
        spdlog::debug("vsock: guest port {} -> host port {}: nothing listens at '{}' ({})",
                      id.guest_port, id.host_port, target, std::strerror(errno));
        return false;
    }
    const StreamPtr s = new_stream(std::move(fd));
    s->id = id;
    streams_[id] = s;
    // The device registers the connection only once we return, so its send budget is not
    // known yet; a fresh connection's budget is the whole send queue, larger than one read.
    s->phase = Stream::Phase::relaying;
    read_from_host(s, s->in.size());
    return true;
}

void VsockHost::on_connected(VsockConnId id)
{
    const auto it = streams_.find(id);
    if (it == streams_.end())
        return;
    const StreamPtr s = it->second;
    // The acknowledgement goes out first, through the same ordered write path as data.
    const std::string ok = fmt::format("OK {}\n", id.host_port);
    s->out.insert(s->out.end(), ok.begin(), ok.end());
    s->own_bytes += ok.size();
    write_to_host(s);
    s->phase = Stream::Phase::relaying;
    read_from_host(s, device_->send_budget(id));
}

void VsockHost::read_from_host(const StreamPtr& s, size_t budget_now)
{
    if (s->closed || s->reading)
        return;
    const size_t budget = std::min(budget_now, s->in.size());
    if (budget == 0) {
        s->read_paused = true;
        return;
    }
    s->read_paused = false;
    s->reading = true;
    s->in_iov = {s->in.data(), budget};
    loop_.readv(s->fd.get(), &s->in_iov, 1, 0, [this, s](int32_t res) {
        std::lock_guard lock(device_->mutex());
        s->reading = false;
        if (s->closed || s->detached)
            return;
        if (res < 0) {
            spdlog::debug("vsock: host side of port {} failed: {}", s->id.guest_port, std::strerror(-res));
            device_->reset(s->id);
            drop(s);
            return;
        }
        if (res == 0) {
            // Host end-of-file: the guest reads to the end of what was sent, then EOF.
            device_->shutdown(s->id, VIRTIO_VSOCK_SHUTDOWN_SEND);
            return;
        }
        device_->send(s->id, {s->in.data(), static_cast<size_t>(res)});
        read_from_host(s, device_->send_budget(s->id));
    });
}

size_t VsockHost::on_data(VsockConnId id, std::span<const uint8_t> data)
{
    const auto it = streams_.find(id);
    if (it == streams_.end())
        return data.size();  // nobody to give it to: take it so the guest is not stalled
    // Held here, reported through consumed() as the host socket takes it; the device never
    // lets more than its advertised credit be outstanding, which bounds this buffer.
    it->second->out.insert(it->second->out.end(), data.begin(), data.end());
    write_to_host(it->second);
    return 0;
}

void VsockHost::write_to_host(const StreamPtr& s)
{
    if (s->closed || s->writing)
        return;
    if (s->out.empty()) {
        if (s->detached) {
            s->closed = true;
            ::shutdown(s->fd.get(), SHUT_RDWR);
        } else if (s->shut_write_when_flushed) {
            ::shutdown(s->fd.get(), SHUT_WR);
        }
        return;
    }
    const size_t n = std::min(s->out.size(), read_chunk);
    s->out_batch.assign(s->out.begin(), s->out.begin() + static_cast<ptrdiff_t>(n));
    s->out_iov = {s->out_batch.data(), n};
    s->writing = true;
    loop_.writev(s->fd.get(), &s->out_iov, 1, 0, [this, s](int32_t res) {
        std::lock_guard lock(device_->mutex());
        s->writing = false;
        if (s->closed)
            return;
        if (res <= 0) {
            spdlog::debug("vsock: writing to the host side of port {} failed: {}", s->id.guest_port,
                          res < 0 ? std::strerror(-res) : "closed");
            device_->reset(s->id);
            drop(s);
            return;
        }
        const auto written = static_cast<size_t>(res);
        s->out.erase(s->out.begin(), s->out.begin() + static_cast<ptrdiff_t>(written));
        const size_t own = std::min(written, s->own_bytes);
        s->own_bytes -= own;
        if (written > own && !s->detached && device_->has_connection(s->id))
            device_->consumed(s->id, written - own);
        write_to_host(s);
    });
}

void VsockHost::on_shutdown(VsockConnId id, uint32_t flags)
{
    const auto it = streams_.find(id);
    if (it == streams_.end())
        return;
    if (flags & VIRTIO_VSOCK_SHUTDOWN_SEND) {
        it->second->shut_write_when_flushed = true;
        write_to_host(it->second);
    }
}

void VsockHost::on_closed(VsockConnId id)
{
    const auto it = streams_.find(id);
    if (it == streams_.end())
        return;
    const StreamPtr s = it->second;
    streams_.erase(it);
    s->detached = true;
    close_detached(s);
}

void VsockHost::on_reset(std::span<const VsockConnId> ids)
{
    // On a vCPU thread, under the device's mutex like every loop callback that touches a
    // stream: no system call here but the eventfd's write. `detached` at once, so that no
    // completion hands the device a connection that is gone.
    for (const VsockConnId id : ids) {
        const auto it = streams_.find(id);
        if (it == streams_.end())
            continue;
        it->second->detached = true;
        reset_streams_.push_back(it->second);
        streams_.erase(it);
    }
    const uint64_t one = 1;
    if (::write(reset_wake_.get(), &one, sizeof(one)) < 0)
        spdlog::warn("vsock: waking the I/O loop for a device reset failed: {}", std::strerror(errno));
}

void VsockHost::close_reset_streams()
{
    std::lock_guard lock(device_->mutex());
    for (const StreamPtr& s : std::exchange(reset_streams_, {}))
        close_detached(s);
}

void VsockHost::close_detached(const StreamPtr& s)
{
    // A guest that shut down its sending side first closed gracefully: what it sent before
    // still goes to the host, then the stream closes (write_to_host finishes the job).
    if (s->closed || (s->shut_write_when_flushed && (s->writing || !s->out.empty())))
        return;
    // Otherwise it is an abort (RST, protocol violation, driver reset): only mark and shut
    // down here; the loop's completions see `closed` and let the stream go.
    s->closed = true;
    ::shutdown(s->fd.get(), SHUT_RDWR);
}

void VsockHost::on_send_space(VsockConnId id)
{
    const auto it = streams_.find(id);
    if (it != streams_.end() && it->second->read_paused)
        read_from_host(it->second, device_->send_budget(id));
}

void VsockHost::drop(const StreamPtr& s)
{
    s->closed = true;
    ::shutdown(s->fd.get(), SHUT_RDWR);
    streams_.erase(s->id);
}

} // namespace agentvm
