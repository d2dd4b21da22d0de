// The APIs serve answers on its listeners, and the order the router asks them in: the
// SandboxFusion endpoints, then the native API, which takes every other request.
#pragma once

#include <optional>
#include <string>

#include "service/fusion/fusion_api.hpp"
#include "service/native/native_api.hpp"
#include "service/router.hpp"

namespace agentvm {

class ServedApis {
public:
    // `token`: required of every request when set (client_auth.hpp).
    ServedApis(SandboxManager& manager, const std::optional<std::string>& token);
    ServedApis(const ServedApis&) = delete;
    ServedApis& operator=(const ServedApis&) = delete;

    // HttpServer::Options::admit.
    HttpServer::Admission admit(HttpExchange& head) const { return router_.admit(head); }

private:
    FusionApi fusion_;
    NativeApi native_;
    Router router_;
};

} // namespace agentvm
