#include "service/e2b/file_access.hpp"

#include "service/client_auth.hpp"

namespace agentvm {
namespace {

// "1767225600" -> 1767225600: digits only, at most 18 of them (no overflow).
std::optional<long long> unix_seconds(const std::string& text)
{
    if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos)
        return std::nullopt;
    return std::stoll(text);
}

} // namespace

std::optional<std::string> file_access_refusal(const SandboxTokens& tokens, std::string_view sandbox_id,
                                               const FileAccess& access, long long now_unix)
{
    // As envd: a token in the header decides alone, even beside a signature.
    if (access.access_token) {
        if (same_secret(*access.access_token, tokens.envd_token(sandbox_id)))
            return std::nullopt;
        return "the X-Access-Token is not this sandbox's envdAccessToken";
    }
    if (!access.signature)
        return "unauthorized: send the sandbox's envdAccessToken as X-Access-Token, or use a signed URL "
               "(downloadUrl/uploadUrl)";
    long long expiry = 0;
    if (access.signature_expiration) {
        const std::optional<long long> seconds = unix_seconds(*access.signature_expiration);
        if (!seconds)
            return "signature_expiration must be a time in unix seconds";
        // 0 would sign like no expiry at all (file_signature): it is long past anyway.
        if (*seconds == 0)
            return "the signature has expired";
        expiry = *seconds;
    }
    const std::string expected = tokens.file_signature(sandbox_id, access.path, access.operation, access.user, expiry);
    if (!same_secret(*access.signature, expected))
        return "invalid signature: it was not made for this sandbox, path, operation and user";
    if (expiry != 0 && expiry < now_unix)
        return "the signature has expired";
    return std::nullopt;
}

} // namespace agentvm
