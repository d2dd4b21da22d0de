// envd's plain-HTTP file transfer as the SDKs use it (docs/e2b.md, "Files"): GET /files
// answers a file's raw bytes from the agent's read_file; POST /files writes one or more files
// from a multipart/form-data body (each part's filename its path) or, from envd 0.5.7, a raw
// application/octet-stream body, through the agent's write_file in chunks, parents made. A
// request carries the sandbox's X-Access-Token, or a URL signature made with it
// (SandboxTokens::file_signature) for the SDK's uploadUrl()/downloadUrl().
#pragma once

#include <memory>
#include <string>

#include "service/e2b/sandbox_tokens.hpp"
#include "service/http_server.hpp"
#include "service/sandbox_manager.hpp"

namespace agentvm {

class EnvdFiles {
public:
    EnvdFiles(SandboxManager& manager, const SandboxTokens& tokens) : manager_(manager), tokens_(tokens) {}

    // A request for /files: checks its token or signature, then its sandbox.
    HttpServer::Admission admit(HttpExchange& head, const std::string& sandbox_id);

private:
    SandboxManager& manager_;
    const SandboxTokens& tokens_;
};

} // namespace agentvm
