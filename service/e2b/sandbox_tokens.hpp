// The secrets E2B's SDKs carry for one sandbox (docs/e2b.md, "Access tokens"): its
// envdAccessToken (X-Access-Token on envd's traffic, and the key of its signed file URLs) and
// its trafficAccessToken (E2B-Traffic-Access-Token on the code interpreter's). Each is an
// HMAC-SHA256 of the sandbox's id under serve's key, so a token opens its own sandbox and no
// other, needs no table, and holds for a sandbox after a pause and resume. The key is made
// once per state directory (kept in it, mode 0600), or per serve without one.
#pragma once

#include <string>
#include <string_view>

namespace agentvm {

class SandboxTokens {
public:
    // `state_dir` empty: a fresh key, held in memory only.
    explicit SandboxTokens(const std::string& state_dir);

    std::string envd_token(std::string_view sandbox_id) const;
    std::string traffic_token(std::string_view sandbox_id) const;

    // E2B's file URL signature for `path`, `operation` ("read" or "write"), `user` (empty for
    // none) and, when not 0, its expiry in unix seconds: "v1_" and the unpadded base64 of
    // sha256("path:operation:user:envd_token[:expiry]").
    std::string file_signature(std::string_view sandbox_id, std::string_view path, std::string_view operation,
                               std::string_view user, long long expiry_unix) const;

private:
    std::string mac(std::string_view purpose, std::string_view sandbox_id) const;

    std::string key_;
};

} // namespace agentvm
