#include "service/e2b/sandbox_tokens.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <span>

#include <fmt/format.h>
#include <nettle/hmac.h>
#include <nettle/sha2.h>

#include "common/base64.hpp"
#include "common/error.hpp"
#include "common/fd.hpp"

namespace agentvm {
namespace {

constexpr size_t key_bytes = 32;

std::string random_key()
{
    std::string key(key_bytes, '\0');
    if (::getrandom(key.data(), key.size(), 0) != static_cast<ssize_t>(key.size()))
        throw_errno("getrandom for serve's E2B token key");
    return key;
}

// The key kept at `path`, or a new one written there (O_EXCL: two serves never race on one
// state directory, which its lock prevents, but a half-written key is never read either).
std::string stored_key(const std::string& path)
{
    Fd in(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (in) {
        std::string key(key_bytes, '\0');
        if (::read(in.get(), key.data(), key.size()) != static_cast<ssize_t>(key.size()))
            throw Error(fmt::format("'{}' is not a {}-byte key: remove it to make a new one (every E2B access "
                                    "token handed out so far then stops working)",
                                    path, key_bytes));
        return key;
    }
    if (errno != ENOENT)
        throw_errno(fmt::format("opening '{}'", path));
    std::string key = random_key();
    const std::string partial = path + ".new";
    ::unlink(partial.c_str());
    Fd out(::open(partial.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!out)
        throw_errno(fmt::format("creating '{}'", partial));
    if (::write(out.get(), key.data(), key.size()) != static_cast<ssize_t>(key.size()) || ::fsync(out.get()) != 0)
        throw_errno(fmt::format("writing '{}'", partial));
    if (::rename(partial.c_str(), path.c_str()) != 0)
        throw_errno(fmt::format("renaming '{}'", partial));
    return key;
}

std::string hex(std::span<const uint8_t> bytes)
{
    std::string out;
    out.reserve(bytes.size() * 2);
    for (uint8_t b : bytes)
        out += fmt::format("{:02x}", b);
    return out;
}

} // namespace

SandboxTokens::SandboxTokens(const std::string& state_dir)
    : key_(state_dir.empty() ? random_key() : stored_key(state_dir + "/e2b-token-key"))
{
}

std::string SandboxTokens::mac(std::string_view purpose, std::string_view sandbox_id) const
{
    hmac_sha256_ctx ctx;
    hmac_sha256_set_key(&ctx, key_.size(), reinterpret_cast<const uint8_t*>(key_.data()));
    hmac_sha256_update(&ctx, purpose.size(), reinterpret_cast<const uint8_t*>(purpose.data()));
    const uint8_t separator = 0;
    hmac_sha256_update(&ctx, 1, &separator);
    hmac_sha256_update(&ctx, sandbox_id.size(), reinterpret_cast<const uint8_t*>(sandbox_id.data()));
    std::array<uint8_t, SHA256_DIGEST_SIZE> digest{};
    hmac_sha256_digest(&ctx, digest.size(), digest.data());
    return hex(digest);
}

std::string SandboxTokens::envd_token(std::string_view sandbox_id) const
{
    return mac("envd", sandbox_id);
}

std::string SandboxTokens::traffic_token(std::string_view sandbox_id) const
{
    return mac("traffic", sandbox_id);
}

std::string SandboxTokens::file_signature(std::string_view sandbox_id, std::string_view path,
                                          std::string_view operation, std::string_view user,
                                          long long expiry_unix) const
{
    std::string text = fmt::format("{}:{}:{}:{}", path, operation, user, envd_token(sandbox_id));
    if (expiry_unix != 0)
        text += fmt::format(":{}", expiry_unix);
    sha256_ctx ctx;
    sha256_init(&ctx);
    sha256_update(&ctx, text.size(), reinterpret_cast<const uint8_t*>(text.data()));
    std::string digest(SHA256_DIGEST_SIZE, '\0');
    sha256_digest(&ctx, digest.size(), reinterpret_cast<uint8_t*>(digest.data()));
    std::string encoded = base64_encode(digest);
    while (!encoded.empty() && encoded.back() == '=')
        encoded.pop_back();
    return "v1_" + encoded;
}

} // namespace agentvm
