// E2B's Sandbox.list (GET /v2/sandboxes) for the whole fleet (docs/e2b.md, "Listing across a
// fleet"; the fan-out is service/fleet/). Every peer is asked the caller's query as it came
// (filters, order, limit and nextToken), so each answers its first `limit` sandboxes after the
// token; the page the caller gets is the first `limit` of all those together, in the list's
// order (startedAt, then sandboxID), which is the fleet's true page since no node can have a
// sandbox in it that is not among its own first `limit`. The next page's token is the last
// entry's key, given when any node had more: a page token is a position in that order, not a
// node's cursor, so it means the same on every node.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "service/e2b/control_plane_wire.hpp"
#include "service/fleet/peer_listing.hpp"

namespace agentvm {

// One ListedSandbox and its place in the list's order.
struct E2bListed {
    PageKey key;
    Json entry;
};

// The key of a ListedSandbox a peer answered (its sandboxID and startedAt), nullopt when it
// has no such fields.
std::optional<PageKey> e2b_listed_key(const Json& entry);

// The path and query to ask the peers: /v2/sandboxes with the list's query arguments the
// caller gave, each encoded again as it was decoded.
std::string e2b_list_target(const QueryArgument& argument);

struct E2bFleetPage {
    Json entries = Json::array();
    std::optional<std::string> next_token;
};
// This node's page (`local`, with `local_more` when it had more) and the peers' answers, as
// one page of `limit` entries. A peer whose answer is not an array of ListedSandbox objects
// is added to `unreached`.
E2bFleetPage merge_e2b_lists(std::vector<E2bListed> local, bool local_more, const std::vector<PeerAnswer>& answers,
                             bool ascending, size_t limit, std::vector<Unreached>& unreached);

} // namespace agentvm
