// The APIs serve answers on its listeners, and the order the router asks them in: E2B's
// (every request with an E2b-Sandbox-Id header, and its control plane's paths), the
// SandboxFusion endpoints, then the native API, which takes every other request.
#pragma once

#include <optional>
#include <string>

#include "service/e2b/e2b_api.hpp"
#include "service/fusion/fusion_api.hpp"
#include "service/native/native_api.hpp"
#include "service/ports/guest_ports.hpp"
#include "service/router.hpp"

namespace agentvm {

class ServedApis {
public:
    // `token`: required of every request when set (client_auth.hpp). `peers`: the fleet's other
    // nodes, whose lists the native and E2B lists gather (service/fleet/peer_listing.hpp).
    ServedApis(SandboxManager& manager, const std::optional<std::string>& token, PeerFetcher* peers = nullptr);
    ServedApis(const ServedApis&) = delete;
    ServedApis& operator=(const ServedApis&) = delete;

    // HttpServer::Options::admit.
    HttpServer::Admission admit(HttpExchange& head) const { return router_.admit(head); }

private:
    // Before the facades, which carry requests to the guests' ports through it, and after
    // them in destruction: a connection still open when serve ends is closed by it.
    GuestPorts ports_;
    E2bApi e2b_;
    FusionApi fusion_;
    NativeApi native_;
    Router router_;
};

} // namespace agentvm
