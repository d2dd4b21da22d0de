// The service's HTTP API (docs/api.md): routes each request to what answers it.
#pragma once

#include <memory>
#include <string_view>

#include "service/http_server.hpp"
#include "service/sandbox_manager.hpp"

namespace agentvm {

class ServiceApi {
public:
    explicit ServiceApi(SandboxManager& manager) : manager_(manager) {}

    void handle(const std::shared_ptr<HttpExchange>& exchange);
    // The requests whose body streams (HttpServer::Options::streams_body): file uploads.
    static bool streams_body(std::string_view method, std::string_view path);
    // The requests that may carry more than HttpServer's max_body: /run_code, /run_jupyter.
    static std::optional<size_t> larger_body(std::string_view method, std::string_view path);

private:
    void route(const std::shared_ptr<HttpExchange>& exchange);
    void create(const std::shared_ptr<HttpExchange>& exchange);
    void paused_request(const std::shared_ptr<HttpExchange>& exchange, const std::string& id,
                        const std::string& action);
    void sandbox_request(const std::shared_ptr<HttpExchange>& exchange, const std::string& id,
                         const std::string& action);
    void call(const std::shared_ptr<HttpExchange>& exchange, const std::shared_ptr<Sandbox>& sandbox,
              const std::string& op);
    // DELETE .../calls/SEQ: the agent's cancel of a running call.
    void cancel(const std::shared_ptr<HttpExchange>& exchange, const std::shared_ptr<Sandbox>& sandbox,
                const std::string& seq_text);
    // GET .../files/stat and .../files/list: the agent's stat and list_dir.
    void file_info(const std::shared_ptr<HttpExchange>& exchange, const std::shared_ptr<Sandbox>& sandbox,
                   const std::string& op, const std::string& file);

    SandboxManager& manager_;
};

} // namespace agentvm
