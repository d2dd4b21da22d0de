#include "service/api.hpp"

#include <fmt/format.h>

namespace agentvm {

void ServiceApi::handle(const std::shared_ptr<HttpExchange>& exchange)
{
    const std::string& path = exchange->path();
    if (path == "/healthz") {
        if (exchange->method() != "GET")
            return exchange->respond_error(405, "method_not_allowed", fmt::format("{} takes GET", path));
        return exchange->respond(200, "{\"status\":\"ok\"}\n");
    }
    exchange->respond_error(404, "not_found", fmt::format("no such endpoint: {} {}", exchange->method(), path));
}

} // namespace agentvm
