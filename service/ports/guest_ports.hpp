// Inbound connections to TCP ports inside sandboxes (docs/api.md, "Ports"), for every API on
// serve: an HTTP request carried to a guest port (PortHttpRelay), or a client connection
// switched to a raw byte stream to one ("Upgrade: agentvm-tcp", for `agentvm port-forward`).
// It holds every such connection that is open, bounded per sandbox, and closes them all
// when serve stops. The ports the facades serve themselves are never forwarded.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/event_loop.hpp"
#include "service/http_server.hpp"
#include "service/ports/socket_poller.hpp"

namespace agentvm {

class Sandbox;

inline constexpr const char* raw_tcp_upgrade = "agentvm-tcp";

class GuestPorts {
public:
    static constexpr size_t max_per_sandbox = 256;

    explicit GuestPorts(EventLoop& loop);
    ~GuestPorts();
    GuestPorts(const GuestPorts&) = delete;
    GuestPorts& operator=(const GuestPorts&) = delete;

    // "8080" -> 8080; throws RefusedRequest (bad_field) for anything but 1..65535, or for a
    // port serve answers itself (E2B's envd and code interpreter).
    static uint16_t port_number(const std::string& text);

    // Carries the request to the guest's `port`, asking its server for `path_and_query`;
    // `strip`: the request's headers that carried serve's credentials.
    void relay_http(const std::shared_ptr<HttpExchange>& exchange, Sandbox& sandbox, uint16_t port,
                    std::string path_and_query, std::vector<std::string> strip);
    // Answers 101 and joins the client's connection to the guest's `port` byte for byte.
    void relay_tcp(const std::shared_ptr<HttpExchange>& exchange, Sandbox& sandbox, uint16_t port);

    size_t open_connections() const { return open_.size(); }
    uint64_t connections_total() const { return total_; }
    uint64_t connections_refused() const { return refused_; }

private:
    struct Open {
        std::string sandbox_id;
        std::shared_ptr<void> keep;
        std::function<void()> close;
    };
    // A refusal when the sandbox has as many connections open as it may.
    bool admit(const std::shared_ptr<HttpExchange>& exchange, const Sandbox& sandbox);
    uint64_t add(const std::string& sandbox_id);
    void remove(uint64_t key);

    EventLoop& loop_;
    SocketPoller poller_;
    std::map<uint64_t, Open> open_;
    std::map<std::string, size_t> per_sandbox_;
    uint64_t next_key_ = 1;
    uint64_t total_ = 0;
    uint64_t refused_ = 0;
};

} // namespace agentvm
