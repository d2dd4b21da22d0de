// The other nodes of a fleet (docs/api.md, "Listing across a fleet"): serve's --peer
// NODE=URL and --peers-file FILE. Every node may be given the same list, the one the front
// door's HAProxy configuration is made from: the entry naming serve's own --node-id is
// dropped (peers_besides), so a node never asks itself.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace agentvm {

struct Peer {
    std::string node;  // a node id (sandbox_ids.hpp, node_id_problem)
    std::string url;   // "http://HOST:PORT", without a trailing '/'
};

// "NODE=URL": URL is http://HOST:PORT (HOST a name, an IPv4 address or a bracketed IPv6
// address; PORT 1-65535; a trailing '/' is dropped; no path, user or query). Throws Error
// naming the problem.
Peer parse_peer(std::string_view text);

// A peers file's text: one NODE=URL a line; blank lines and lines whose first non-blank is
// '#' are skipped, as is what follows a " #" on a line. Errors name `origin` and the line.
std::vector<Peer> parse_peers_text(std::string_view text, std::string_view origin);
// The file at `path`, as parse_peers_text reads it; throws Error when it cannot be read.
std::vector<Peer> read_peers_file(const std::string& path);

// The peers of the node `self`: `peers` without the one named `self`. A node named twice,
// or one URL under two nodes, is refused (Error): each would be asked twice.
std::vector<Peer> peers_besides(const std::vector<Peer>& peers, std::string_view self);

} // namespace agentvm
