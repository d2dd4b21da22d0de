// A list answered for the whole fleet (docs/api.md, "Listing across a fleet"): what the
// peers answered a list request, read and checked, merged with this node's own list, and the
// nodes that could not be heard named rather than hidden. Pure: PeerFetcher (peer_fetcher.hpp)
// does the HTTP; each facade's list merges in its own shape (the native one here, E2B's in
// service/e2b/e2b_fleet_list.hpp).
//
// The wire, the same for every list:
// - serve asks each peer the caller's request with the header `Agentvm-List-Scope: node`: a
//   list request carrying it is answered from that node alone, so no node asks further;
// - the answer is 200 whatever the peers did; each node not heard is named, with why, in the
//   header `Agentvm-Unreached-Nodes: n2 (could not connect); n3 (no answer within 5 s)`, which
//   is absent when every node answered.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "protocol/agent_protocol.hpp"
#include "service/http_server.hpp"

namespace agentvm {

inline constexpr char list_scope_header[] = "Agentvm-List-Scope";
inline constexpr char list_scope_node[] = "node";
inline constexpr char unreached_header[] = "Agentvm-Unreached-Nodes";

// What one peer answered, as PeerFetcher brings it back.
struct PeerAnswer {
    std::string node;
    std::string problem;  // why there is no answer (transport, timeout, size); "" when there is
    long status = 0;      // the HTTP status, when there is an answer
    std::string body;
    std::optional<std::string> next_token;  // its X-Next-Token header (E2B's paging)
};

// A node whose list is missing from the answer, and why.
struct Unreached {
    std::string node;
    std::string problem;
};

// Whether the request asks for its own node's list alone (the scope header).
bool node_scope_only(const HttpExchange& exchange);

// The request's credentials as header lines to send on to the peers (a fleet shares one
// token): its Authorization and X-API-KEY headers, those it has.
std::vector<std::string> forwarded_credentials(const HttpExchange& exchange);

// The peer's answer as JSON: its body when it answered 200 with JSON no deeper than
// max_json_depth; nullopt, with `problem` set, otherwise.
std::optional<Json> peer_json(const PeerAnswer& answer, std::string& problem);

// The value of the unreached header ("" when `unreached` is empty): "NODE (PROBLEM)" joined
// with "; ", each problem cut to 200 bytes, with only printable ASCII (';' becomes ','), so
// that the header stays one line that splits back into its nodes.
std::string unreached_text(const std::vector<Unreached>& unreached);

// The native list (docs/api.md, GET /v1/sandboxes) of the fleet: `local` (this node's
// SANDBOX objects) then each peer's, in the peers' order, a sandbox id seen twice kept once.
// A peer whose answer is not {"sandboxes": [object with a string "id", ...]} is unreached.
// The answer is {"sandboxes": [...], "unreached": [{"node", "problem"}, ...]}; `unreached`
// gets the same entries.
Json merge_native_lists(Json local, const std::vector<PeerAnswer>& answers, std::vector<Unreached>& unreached);

} // namespace agentvm
