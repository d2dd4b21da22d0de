// envd, E2B's in-sandbox daemon, as the SDKs reach it on port 49983 (docs/e2b.md, "envd"):
// Connect-RPC's process.Process (envd_process.hpp) and filesystem.Filesystem
// (envd_filesystem.hpp) over connect_wire.hpp, and plain HTTP /files (envd_files.hpp) and
// /health, each mapped onto the sandbox's agent calls.
#pragma once

#include <memory>
#include <string>

#include "service/e2b/envd_files.hpp"
#include "service/e2b/sandbox_tokens.hpp"
#include "service/http_server.hpp"
#include "service/sandbox_manager.hpp"

namespace agentvm {

struct EnvdRpc;

class EnvdApi {
public:
    EnvdApi(SandboxManager& manager, const SandboxTokens& tokens)
        : manager_(manager), tokens_(tokens), files_{manager, tokens}
    {
    }

    // Checks the request's X-Access-Token (or, for /files, its URL signature) against the
    // sandbox's, then its sandbox (502 when it is not running), and gives its handler.
    // /health needs no token.
    HttpServer::Admission admit(HttpExchange& head, const std::string& sandbox_id);

private:
    HttpServer::Admission admit_health(HttpExchange& head, const std::string& sandbox_id);
    void handle_rpc(const std::shared_ptr<HttpExchange>& exchange, const EnvdRpc* rpc, const std::string& sandbox_id);

    SandboxManager& manager_;
    const SandboxTokens& tokens_;
    EnvdFiles files_;
};

} // namespace agentvm
