// Who may read or write a sandbox's files through envd's GET and POST /files (docs/e2b.md,
// "Files"), as envd decides it: a request carrying X-Access-Token must carry the sandbox's
// envd token; one without it must carry the URL signature the SDKs' downloadUrl()/uploadUrl()
// make from that token (SandboxTokens::file_signature) for this very path, operation and
// user, not past its signature_expiration when it has one.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "service/e2b/sandbox_tokens.hpp"

namespace agentvm {

struct FileAccess {
    std::optional<std::string> access_token;          // X-Access-Token
    std::optional<std::string> signature;             // ?signature=
    std::optional<std::string> signature_expiration;  // ?signature_expiration=, unix seconds
    std::string path;                                 // ?path=, empty when absent (uploadUrl() without one)
    std::string user;                                 // ?username=, empty when absent
    std::string_view operation;                       // "read" (GET) or "write" (POST)
};

// Why `access` does not open sandbox `sandbox_id`'s files at `now_unix` (a 401's message), or
// nullopt when it does.
std::optional<std::string> file_access_refusal(const SandboxTokens& tokens, std::string_view sandbox_id,
                                               const FileAccess& access, long long now_unix);

} // namespace agentvm
