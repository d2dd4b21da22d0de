// A sandbox's egress proxy (docs/api.md, "Egress"): the host end of its guest's 127.0.0.1:3128.
// The guest agent carries each proxy connection over vsock to host port 3128, which the VMM
// turns into a connection to the Unix socket "<its --vsock-uds>_3128"; the proxy listens there,
// in serve (outside the VMM's jail), for as long as the sandbox has a policy. Each connection is
// an EgressConnection; the proxy holds the sandbox's limits (connections at once, bytes over
// its life) and its policy, which a facade may replace (new connections are judged by it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/fd.hpp"
#include "service/egress/egress_connection.hpp"

namespace agentvm {

// What a guest with a policy gets in every call's environment: the proxy the agent offers on
// the guest's loopback (guest/agent/egress_relay.hpp), in both spellings tools read, and the
// guest's own addresses kept off it.
std::map<std::string, std::string> egress_proxy_env();

struct EgressLimits {
    size_t max_connections = 64;               // open at once
    uint64_t max_bytes = uint64_t{4} << 30;    // both ways, over the sandbox's life
};

class EgressProxy {
public:
    struct Hooks {
        std::function<uint64_t(const ProxyRequest&)> on_request;  // the history entry it starts
        std::function<void(std::optional<uint64_t> history, const EgressOutcome&)> on_end;
    };

    // Listens at `socket_path` (replacing nothing: the path must be free). Throws Error.
    EgressProxy(EventLoop& loop, SocketPoller& poller, NameResolver& resolver, EgressPolicy policy,
                EgressLimits limits, std::string socket_path, Hooks hooks);
    // Closes every connection (each ends in the history as closed) and removes the socket.
    ~EgressProxy();
    EgressProxy(const EgressProxy&) = delete;
    EgressProxy& operator=(const EgressProxy&) = delete;

    const EgressPolicy& policy() const { return policy_; }
    void set_policy(EgressPolicy policy) { policy_ = std::move(policy); }
    size_t open_connections() const { return connections_.size(); }
    uint64_t bytes_used() const { return bytes_used_; }

    // "<vsock-uds>_3128": where the VMM connects for guest port 3128.
    static std::string socket_for(const std::string& vsock_uds);

private:
    void accept_all();
    bool spend(uint64_t bytes);

    SocketPoller& poller_;
    EgressPolicy policy_;
    EgressLimits limits_;
    std::string socket_path_;
    Hooks hooks_;
    EgressConnection::Context context_;
    Fd listener_;
    std::map<EgressConnection*, std::shared_ptr<EgressConnection>> connections_;
    // Refused for the limit and lingering with their answer: not counted against it.
    std::map<EgressConnection*, std::shared_ptr<EgressConnection>> refused_;
    uint64_t bytes_used_ = 0;
    bool closing_ = false;
};

} // namespace agentvm
