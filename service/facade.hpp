// One API served on serve's listeners: the native API (service/native/), SandboxFusion's
// endpoints (service/fusion/), and the next ones. A facade is a translation layer over the
// same sandboxes (SandboxManager): it says which requests are its own from their heads alone
// (method, path, headers, so routing by a header works as well as by a path), admits each
// (its authentication, body limit, streaming), writes errors in its wire's shape and answers.
#pragma once

#include <memory>

#include "service/http_server.hpp"

namespace agentvm {

class Facade {
public:
    virtual ~Facade() = default;
    // Whether this facade answers the request, from its head.
    virtual bool takes(const HttpExchange& head) const = 0;
    // How the request is let in, or refused at the door (its answer's headers may be added
    // here). The handler and error writer are the facade's own.
    virtual HttpServer::Admission admit(HttpExchange& head) = 0;
};

} // namespace agentvm
