#include "service/client_auth.hpp"

#include "service/local_client.hpp"

namespace agentvm {
namespace {

bool carries_token(const HttpExchange& head, const std::string& token)
{
    if (const std::optional<std::string> header = head.header("Authorization")) {
        constexpr std::string_view bearer = "Bearer ";
        if (std::string_view(*header).starts_with(bearer))
            return same_secret(std::string_view(*header).substr(bearer.size()), token);
    }
    const std::optional<std::string> password = head.basic_auth_password();
    return password && same_secret(*password, token);
}

bool local_client(const HttpExchange& head)
{
    if (const std::optional<std::string> origin = head.header("Origin"); origin && !is_loopback_origin(*origin))
        return false;
    if (head.from_unix_socket())
        return true;
    const std::optional<std::string> host = head.header("Host");
    return host && is_loopback_host(*host);
}

} // namespace

bool same_secret(std::string_view a, std::string_view b)
{
    unsigned char diff = a.size() == b.size() ? 0 : 1;
    for (size_t i = 0; i < a.size(); ++i)
        diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
    return diff == 0;
}

std::optional<Refusal> client_refusal(HttpExchange& head, const std::optional<std::string>& token)
{
    if (token) {
        if (carries_token(head, *token))
            return std::nullopt;
        head.add_header("WWW-Authenticate", "Basic realm=\"agentvm\"");
        return Refusal{ServiceError::unauthorized,
                       "a valid token is required: 'Authorization: Bearer TOKEN', or TOKEN as the password of "
                       "HTTP Basic auth",
                       std::nullopt};
    }
    if (local_client(head))
        return std::nullopt;
    return Refusal{ServiceError::forbidden,
                   "without a token serve takes requests from this host's own clients only: the Host must name a "
                   "loopback address, and an Origin must be a loopback one",
                   std::nullopt};
}

} // namespace agentvm
