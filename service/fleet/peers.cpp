#include "service/fleet/peers.hpp"

#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/whole_number.hpp"
#include "service/sandbox_ids.hpp"

namespace agentvm {
namespace {

std::string_view trimmed(std::string_view text)
{
    const size_t start = text.find_first_not_of(" \t\r");
    if (start == std::string_view::npos)
        return {};
    const size_t end = text.find_last_not_of(" \t\r");
    return text.substr(start, end - start + 1);
}

// Why `host` cannot be a peer's host ("" when it can): a DNS name or IPv4 address of letters,
// digits, '.', '-' and '_', or an IPv6 address in brackets.
std::string host_problem(std::string_view host)
{
    if (host.empty())
        return "it names no host";
    if (host.front() == '[') {
        if (host.size() < 3 || host.back() != ']'
            || host.substr(1, host.size() - 2).find_first_not_of("0123456789abcdefABCDEF:.") != std::string_view::npos)
            return "an IPv6 host is hex digits, ':' and '.' in brackets";
        return "";
    }
    if (host.size() > 253)
        return "the host name is longer than 253 characters";
    for (const char c : host)
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-'
              || c == '_'))
            return "the host has only letters, digits, '.', '-' and '_' (or is an IPv6 address in brackets)";
    return "";
}

} // namespace

Peer parse_peer(std::string_view text)
{
    const size_t equals = text.find('=');
    if (equals == std::string_view::npos)
        throw Error(fmt::format("peer '{:.200}': expected NODE=URL (n2=http://10.0.0.2:8080)", text));
    Peer peer{std::string(text.substr(0, equals)), ""};
    if (const std::string problem = node_id_problem(peer.node); !problem.empty())
        throw Error(fmt::format("peer '{:.200}': '{:.64}' is not a node id: {}", text, peer.node, problem));
    std::string_view url = text.substr(equals + 1);
    constexpr std::string_view scheme = "http://";
    if (!url.starts_with(scheme))
        throw Error(fmt::format("peer '{:.200}': the URL must be http://HOST:PORT", text));
    std::string_view authority = url.substr(scheme.size());
    if (authority.ends_with('/'))
        authority.remove_suffix(1);
    if (authority.find_first_of("/?#@") != std::string_view::npos)
        throw Error(fmt::format("peer '{:.200}': the URL is http://HOST:PORT, without a path, query or user", text));
    const size_t colon = authority.rfind(':');
    if (colon == std::string_view::npos || (authority.front() == '[' && authority.find(']') > colon))
        throw Error(fmt::format("peer '{:.200}': the URL names no port (http://HOST:PORT)", text));
    const std::string_view host = authority.substr(0, colon);
    if (const std::string problem = host_problem(host); !problem.empty())
        throw Error(fmt::format("peer '{:.200}': {}", text, problem));
    const std::string_view port_text = authority.substr(colon + 1);
    if (!port_number(port_text))
        throw Error(fmt::format("peer '{:.200}': the port must be a number from 1 to 65535", text));
    peer.url = fmt::format("{}{}", scheme, authority);
    return peer;
}

std::vector<Peer> parse_peers_text(std::string_view text, std::string_view origin)
{
    std::vector<Peer> peers;
    size_t line_number = 0;
    while (!text.empty()) {
        const size_t newline = text.find('\n');
        std::string_view line = text.substr(0, newline);
        text = newline == std::string_view::npos ? std::string_view() : text.substr(newline + 1);
        ++line_number;
        if (const size_t comment = line.find(" #"); comment != std::string_view::npos)
            line = line.substr(0, comment);
        line = trimmed(line);
        if (line.empty() || line.front() == '#')
            continue;
        try {
            peers.push_back(parse_peer(line));
        } catch (const Error& e) {
            throw Error(fmt::format("{}, line {}: {}", origin, line_number, e.what()));
        }
    }
    return peers;
}

std::vector<Peer> read_peers_file(const std::string& path)
{
    std::ifstream file(path, std::ios::binary);
    if (!file)
        throw Error(fmt::format("--peers-file {}: cannot be read", path));
    std::ostringstream text;
    text << file.rdbuf();
    return parse_peers_text(text.str(), fmt::format("--peers-file {}", path));
}

std::vector<Peer> peers_besides(const std::vector<Peer>& peers, std::string_view self)
{
    std::vector<Peer> others;
    for (size_t i = 0; i < peers.size(); ++i) {
        for (size_t j = 0; j < i; ++j) {
            if (peers[j].node == peers[i].node)
                throw Error(fmt::format("peer {} is named twice ({} and {})", peers[i].node, peers[j].url,
                                        peers[i].url));
            if (peers[j].url == peers[i].url)
                throw Error(fmt::format("peers {} and {} have the same URL {}", peers[j].node, peers[i].node,
                                        peers[i].url));
        }
        if (peers[i].node != self)
            others.push_back(peers[i]);
    }
    return others;
}

} // namespace agentvm
