// One connection to a sandbox's egress proxy (egress_proxy.hpp), from reading the tool's proxy
// request to the end of the tunnel: read the head (ProxyRequestReader, within head_timeout),
// judge the name (EgressPolicy::check_name), resolve it off the loop (NameResolver, within
// resolve_timeout), judge every address, connect to exactly an address that passed (each
// within connect_timeout, the next on failure), then answer 200 (CONNECT) or send the
// rewritten head (plain HTTP) and splice bytes both ways (ByteTunnel). A refusal is a whole
// HTTP answer the tool shows (proxy_answer.hpp), then the connection is closed.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/fd.hpp"
#include "core/event_loop.hpp"
#include "core/loop_timer.hpp"
#include "service/egress/egress_policy.hpp"
#include "service/egress/name_resolver.hpp"
#include "service/egress/proxy_answer.hpp"
#include "service/egress/proxy_request.hpp"
#include "service/ports/byte_tunnel.hpp"
#include "service/ports/socket_poller.hpp"

namespace agentvm {

// What one connection came to, for the sandbox's history and /metrics.
struct EgressOutcome {
    std::string method;       // CONNECT, GET, ...; empty when no request was read
    std::string destination;  // "pypi.org:443"
    std::string address;      // the address connected to, if any
    bool allowed = false;     // the policy let it through and the connection was made
    std::optional<ProxyRefusalStatus> refusal;
    std::string reason;       // why it was refused or failed, or which rule allowed it
    uint64_t bytes_out = 0;   // sandbox to destination, the request head included
    uint64_t bytes_in = 0;    // destination to sandbox
    double seconds = 0;
};

class EgressConnection : public std::enable_shared_from_this<EgressConnection> {
public:
    static constexpr std::chrono::seconds head_timeout{30};
    static constexpr std::chrono::seconds resolve_timeout{15};
    static constexpr std::chrono::seconds connect_timeout{10};
    // How long a refused tool gets to read its answer before the connection is closed.
    static constexpr std::chrono::seconds refusal_linger{2};

    struct Context {
        EventLoop& loop;
        SocketPoller& poller;
        NameResolver& resolver;
        // The policy when the request is judged (a sandbox's policy may change meanwhile).
        std::function<const EgressPolicy&()> policy;
        // Bytes the tunnel moved: false once the sandbox's byte budget is spent (the tunnel
        // is cut). Also asked once before connecting, with 0.
        std::function<bool(uint64_t bytes)> spend;
        // The request is read: returns the history entry to end with the outcome.
        std::function<uint64_t(const ProxyRequest&)> on_request;
        // Once, when the connection has ended (refused, failed or closed).
        std::function<void(EgressConnection&, std::optional<uint64_t> history, const EgressOutcome&)> on_end;
    };

    static std::shared_ptr<EgressConnection> start(Context& context, Fd sandbox_side);
    // A connection refused before its request is read (the sandbox's limit on connections):
    // the answer, then the same linger as any refusal.
    static std::shared_ptr<EgressConnection> refuse_at_once(Context& context, Fd sandbox_side,
                                                            ProxyRefusalStatus status, const std::string& reason);
    ~EgressConnection();
    EgressConnection(const EgressConnection&) = delete;
    EgressConnection& operator=(const EgressConnection&) = delete;

    // Closes it now (the sandbox is ending): on_end runs if it has not.
    void close(const std::string& why);
    bool closed() const { return ended_; }

private:
    enum class Phase { reading, resolving, connecting, tunnel, refusing, closed };

    EgressConnection(Context& context, Fd sandbox_side);
    void begin();
    void on_sandbox_ready();
    void on_request(ProxyRequest request);
    void on_resolved(Resolution resolution);
    void connect_next();
    void on_upstream_ready();
    void open_tunnel();
    void refuse(ProxyRefusalStatus status, const std::string& reason);
    void on_timer();
    void finish();

    Context& context_;
    Fd sandbox_;
    Fd upstream_;
    Phase phase_ = Phase::reading;
    ProxyRequestReader reader_;
    ProxyRequest request_;
    std::vector<IpAddress> candidates_;  // addresses that passed, not yet tried
    std::string last_failure_;
    std::optional<uint64_t> history_;
    EgressOutcome outcome_;
    std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
    LoopTimer timer_;
    std::shared_ptr<ByteTunnel> tunnel_;
    bool ended_ = false;
};

} // namespace agentvm
