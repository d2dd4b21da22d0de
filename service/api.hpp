// The service's HTTP API (docs/api.md): routes each request to what answers it.
#pragma once

#include <memory>

#include "service/http_server.hpp"

namespace agentvm {

class ServiceApi {
public:
    void handle(const std::shared_ptr<HttpExchange>& exchange);
};

} // namespace agentvm
