// The host end of the guest's vsock, over Unix sockets, following Firecracker's "hybrid
// vsock" convention so existing tools work unchanged:
//  - host -> guest: connect to the listening socket at `path`, write "CONNECT <port>\n",
//    read "OK <host port>\n", then the stream is the guest's port <port>;
//  - guest -> host port P: agentvm connects to the Unix socket "<path>_P" if something
//    listens there; otherwise the guest's connect is refused (RST).
// Without a path nothing on the host is reachable and the guest can reach nothing.
//
// Threads: everything runs on the event loop's thread. The device's mutex is the only lock:
// loop callbacks take it before touching connections, and the device calls back with it
// held, so the two can never wait on each other.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "devices/virtio_vsock.hpp"
#include "vmm/event_loop.hpp"
#include "vmm/fd.hpp"

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
    // Shuts every host stream so that no I/O stays in flight: call before draining the loop.
    void close_all();

    bool on_connect_request(VsockConnId id) override;
    void on_connected(VsockConnId id) override;
    size_t on_data(VsockConnId id, std::span<const uint8_t> data) override;
    void on_shutdown(VsockConnId id, uint32_t flags) override;
    void on_closed(VsockConnId id) override;
    void on_send_space(VsockConnId id) override;

private:
    struct Stream;
    using StreamPtr = std::shared_ptr<Stream>;

    void accept_clients();
    void read_connect_line(const StreamPtr& s);
    void start_connect(const StreamPtr& s, uint32_t port);  // device mutex held
    // Reads at most budget_now bytes (what the device can queue for the guest right now).
    void read_from_host(const StreamPtr& s, size_t budget_now);
    void write_to_host(const StreamPtr& s);
    void drop(const StreamPtr& s);

    EventLoop& loop_;
    std::optional<std::string> path_;
    Fd listener_;
    VirtioVsock* device_ = nullptr;
    uint32_t next_host_port_ = 1u << 30;  // ports we hand out to host-initiated connections
    std::map<VsockConnId, StreamPtr> streams_;
};

} // namespace agentvm
