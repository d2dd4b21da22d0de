// The host end of the guest's vsock, over Unix sockets, following Firecracker's "hybrid
// vsock" convention so existing tools work unchanged:
//  - host -> guest: connect to the listening socket at `path`, write "CONNECT <port>\n",
//    read "OK <host port>\n", then the stream is the guest's port <port>;
//  - guest -> host port P: agentvm connects to the Unix socket "<path>_P" if something
//    listens there; otherwise the guest's connect is refused (RST).
// Without a path nothing on the host is reachable and the guest can reach nothing.
//
// Every stream costs the VMM one descriptor, and the guest opens connections at will: a
// connection the VMM cannot serve (over stream_cap(), or no socket to be had) is refused
// with RST and a rate-limited warning, never an error that would stop the VM. Host clients
// past the cap, or with no descriptor to be had, wait in the listener's backlog until
// streams close.
//
// Threads: everything runs on the event loop's thread. The device's mutex is the only lock:
// loop callbacks take it before touching connections, and the device calls back with it
// held, so the two can never wait on each other. The one callback from another thread is a
// driver reset's on_reset, on a vCPU thread: it only marks the streams and wakes the loop,
// which closes them, so a vCPU thread never shuts down or closes a socket.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "devices/virtio_vsock.hpp"
#include "core/event_loop.hpp"
#include "common/fd.hpp"
#include "core/loop_timer.hpp"

namespace agentvm {

class VsockHost : public VsockBackend {
public:
    // Listens at `path` when given; throws Error if it cannot (path taken, directory missing).
    VsockHost(EventLoop& loop, std::optional<std::string> path);
    ~VsockHost() override;
    VsockHost(const VsockHost&) = delete;
    VsockHost& operator=(const VsockHost&) = delete;

    // The device this backend serves; set once, before the guest runs.
    void attach(VirtioVsock& device) { device_ = &device; }
    // A connection to guest port `port` for agentvm itself, without a Unix socket path: the
    // returned socket behaves exactly like a hybrid client that has sent "CONNECT <port>\n":
    // it reads "OK <n>\n" once the guest accepts, or end-of-file if it refuses. Call on the
    // loop's thread (or before it runs).
    Fd connect_internal(uint32_t port);
    // Shuts every host stream, those still in their handshake or flushing included, so that
    // no I/O stays in flight, and refuses every connection from now on: call before
    // draining the loop.
    void close_all();

    // Host streams open now, each holding one descriptor (also those the device has let go
    // of whose last bytes are still being written).
    size_t open_streams();
    // How many streams may be open before a guest's connection is refused: the soft
    // RLIMIT_NOFILE less a reserve for every other descriptor the VMM needs (devices,
    // vCPUs, timers, the agent link, the console).
    size_t stream_cap() const { return stream_cap_; }
    static size_t stream_cap_for(uint64_t soft_limit);
    // Reads RLIMIT_NOFILE again: done when the VM is built and again as it starts running,
    // since a jail may change the limit in between, and the I/O loop's thread may not be
    // allowed to ask once it runs. Not thread-safe: before the loop runs, or on its thread.
    void update_stream_cap();

    bool on_connect_request(VsockConnId id) override;
    void on_connected(VsockConnId id) override;
    size_t on_data(VsockConnId id, std::span<const uint8_t> data) override;
    void on_shutdown(VsockConnId id, uint32_t flags) override;
    void on_closed(VsockConnId id) override;
    void on_reset(std::span<const VsockConnId> ids) override;
    void on_send_space(VsockConnId id) override;

private:
    struct Stream;
    using StreamPtr = std::shared_ptr<Stream>;

    // A stream for fd, counted by open_streams() and reached by close_all() for as long as
    // it lives.
    StreamPtr new_stream(Fd fd);
    void watch_listener();
    void accept_clients();
    // Stops accepting for a moment: no descriptor for another client (why says so).
    void pause_accepting(const std::string& why);
    void read_connect_line(const StreamPtr& s);
    void start_connect(const StreamPtr& s, uint32_t port);  // device mutex held
    // Reads at most budget_now bytes (what the device can queue for the guest right now).
    void read_from_host(const StreamPtr& s, size_t budget_now);
    void write_to_host(const StreamPtr& s);
    void drop(const StreamPtr& s);
    // The device let go of the stream: it closes once the guest's last bytes are written, or
    // now when the guest did not close gracefully.
    void close_detached(const StreamPtr& s);
    // On the loop: closes the streams a driver reset let go of.
    void close_reset_streams();

    EventLoop& loop_;
    std::optional<std::string> path_;
    Fd listener_;
    std::optional<LoopTimer> accept_retry_;  // watches the listener again after a pause
    bool accept_paused_ = false;             // warned about the pause already
    VirtioVsock* device_ = nullptr;
    uint32_t next_host_port_ = 1u << 30;  // ports we hand out to host-initiated connections
    std::map<VsockConnId, StreamPtr> streams_;
    // Every stream ever made that may still be alive; pruned of the dead as it grows.
    std::vector<std::weak_ptr<Stream>> sockets_;
    size_t prune_at_ = 64;
    bool closing_ = false;  // close_all() ran
    // Streams a driver reset let go of, until the loop closes them; guarded by the device's
    // mutex. reset_wake_ is the eventfd that tells the loop.
    std::vector<StreamPtr> reset_streams_;
    Fd reset_wake_;
    size_t stream_cap_ = 0;
    WarnLimiter warn_;       // for refusals, which the guest triggers at will
};

} // namespace agentvm
