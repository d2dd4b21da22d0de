// The HTTP client serve asks its peers with (docs/api.md, "Listing across a fleet"):
// libcurl's multi interface driven from serve's event loop, the way HttpServer drives MHD:
// curl's sockets sit in an epoll set whose fd the loop watches, curl's timeout is a LoopTimer,
// and no thread is added (nor would the loop's single thread ever block on a peer).
//
// Bounds, per peer: connect within 2 s, the whole answer within 5 s, at most 16 MiB of body
// (a larger Content-Length is refused before its body comes), plain http:// only, no
// redirects, no proxy (a fleet's nodes reach each other directly, whatever http_proxy says).
// At most 32 fan-outs run at once; past that a fan-out's peers are reported as not asked.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/fd.hpp"
#include "core/event_loop.hpp"
#include "core/loop_timer.hpp"
#include "service/fleet/peer_listing.hpp"
#include "service/fleet/peers.hpp"

namespace agentvm {

struct PeerLimits {
    std::chrono::milliseconds connect_timeout{2000};
    std::chrono::milliseconds total_timeout{5000};
    size_t max_body = size_t{16} << 20;
    size_t max_fan_outs = 32;
};

class PeerFetcher {
public:
    using Done = std::function<void(std::vector<PeerAnswer>)>;

    // Throws Error when curl or the epoll set cannot be had.
    PeerFetcher(EventLoop& loop, std::vector<Peer> peers, PeerLimits limits = {});
    // Drops every fan-out still running: their `done` never runs.
    ~PeerFetcher();
    PeerFetcher(const PeerFetcher&) = delete;
    PeerFetcher& operator=(const PeerFetcher&) = delete;

    const std::vector<Peer>& peers() const { return peers_; }

    // GETs `target` (a path and query) from every peer at once, with the header lines
    // `headers` and the list scope header; `done` runs on the loop's thread, never within
    // this call, once each peer has answered or failed, with one answer per peer in the
    // peers' order.
    void get_all(const std::string& target, const std::vector<std::string>& headers, Done done);

    // Logs a warning for each unreached node, at most once a minute per node (debug otherwise):
    // a client that lists every second while a node is down does not flood the log.
    void log_unreached(const std::vector<Unreached>& unreached);

private:
    struct Transfer;
    struct FanOut;
    static int on_socket(void* easy, int socket, int what, void* self, void* socket_data);
    static int on_timer(void* multi, long timeout_ms, void* self);
    static size_t on_body(char* data, size_t size, size_t count, void* transfer);
    static size_t on_header(char* data, size_t size, size_t count, void* transfer);
    // The answer of a transfer curl has finished (`result` its CURLcode).
    static PeerAnswer answer_of(Transfer& transfer, int result, const PeerLimits& limits);
    void on_ready();
    void on_timeout();
    // Reads what curl finished, then runs the `done` of every fan-out complete.
    void collect();
    void finish(std::vector<std::shared_ptr<FanOut>> complete);

    EventLoop& loop_;
    std::vector<Peer> peers_;
    PeerLimits limits_;
    Fd epoll_;
    void* multi_ = nullptr;  // CURLM*
    std::set<int> watched_;  // curl's sockets in epoll_
    std::map<void*, std::unique_ptr<Transfer>> transfers_;  // by CURL*
    size_t fan_outs_ = 0;
    std::optional<LoopTimer> timer_;
    std::optional<LoopTimer> soon_;  // runs finish() for fan-outs completed without curl
    std::vector<std::shared_ptr<FanOut>> complete_;
    std::map<std::string, std::chrono::steady_clock::time_point> warned_;
};

} // namespace agentvm
