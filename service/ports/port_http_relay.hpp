// One client request to a port of a sandbox's guest, carried as HTTP: the request (its body
// streamed, with backpressure) goes to the server in the guest on a connection of its own,
// and the server's answer comes back streamed the same way, or, when the server switches
// protocols (a WebSocket's 101), the two connections are joined byte for byte (ByteTunnel).
// Every failure before the answer's head is the client's 502 naming it; one after is a cut
// stream; either closes the guest connection. The client going away closes it too.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "service/http_server.hpp"
#include "service/ports/byte_tunnel.hpp"
#include "service/ports/guest_http_response.hpp"
#include "service/ports/guest_port_dialer.hpp"
#include "service/ports/guest_request_head.hpp"

namespace agentvm {

class PortHttpRelay : public std::enable_shared_from_this<PortHttpRelay> {
public:
    struct Target {
        std::string sandbox_id;
        std::string vsock_path;
        uint16_t port = 0;
        std::string path_and_query;        // what the guest's server is asked for, from '/'
        std::vector<std::string> strip;    // the client's credentials for serve, never passed on
    };

    // on_done runs once, when the relay has closed everything (and, after an upgrade, when the
    // tunnel has).
    static std::shared_ptr<PortHttpRelay> start(EventLoop& loop, SocketPoller& poller,
                                                std::shared_ptr<HttpExchange> exchange, Target target,
                                                std::function<void()> on_done);
    ~PortHttpRelay();
    PortHttpRelay(const PortHttpRelay&) = delete;
    PortHttpRelay& operator=(const PortHttpRelay&) = delete;

    // Ends everything now (serve stops).
    void close();

private:
    PortHttpRelay(SocketPoller& poller, std::shared_ptr<HttpExchange> exchange, Target target,
                  std::function<void()> on_done);
    void begin(EventLoop& loop);
    void opened(DialedPort dialed);
    void failed(const std::string& why);
    void on_ready();
    void send_pending();
    void read_answer();
    void on_head(const GuestHttpResponse::Head& head);
    void answer_failed(const std::string& why);
    std::function<void()> upgraded(HttpExchange::UpgradedSocket client);
    void done();

    SocketPoller& poller_;
    std::shared_ptr<HttpExchange> exchange_;
    Target target_;
    std::function<void()> on_done_;
    GuestRequestHead head_;
    std::shared_ptr<GuestPortDialer> dialer_;
    Fd guest_;
    std::string to_guest_;        // the request's head and body not yet sent
    bool body_ended_ = false;
    bool body_paused_ = false;    // by us, while to_guest_ is full
    bool answer_paused_ = false;  // the client has not taken what it was sent
    bool upgrading_ = false;      // a 101 is on its way to the client: the guest waits
    std::optional<GuestHttpResponse> answer_;
    std::string from_guest_;      // after a 101: the new protocol's first bytes
    std::shared_ptr<ByteTunnel> tunnel_;
    bool finished_ = false;
};

} // namespace agentvm
