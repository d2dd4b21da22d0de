// E2B's network options (create's allow_internet_access and network, PUT /sandboxes/{id}/network)
// as agentvm's egress rules (docs/e2b.md, "Network"). E2B's model: internet access on unless
// allow_internet_access is false or denyOut holds 0.0.0.0/0 (the SDK's ALL_TRAFFIC), denyOut
// CIDR ranges cut out of it, and allowOut entries (names, *.domains, addresses, ranges) let
// through whatever the rest denies. Mapped:
//   allow = ["*" when internet access is on] + allowOut,  deny = denyOut without 0.0.0.0/0
// agentvm's rule differs in two ways: a denial beats an allowOut entry it overlaps (E2B lets
// the allowOut entry through), and "*" reaches public addresses only (private, loopback and
// link-local ones need an allowOut range naming them).
// A create with neither field gets serve's default (--egress-allow), as a native create does.
#pragma once

#include <optional>

#include "protocol/agent_protocol.hpp"
#include "service/sandbox_settings.hpp"

namespace agentvm {

struct E2bNetworkFields {
    std::optional<bool> allow_internet_access;
    const Json* network = nullptr;  // the "network" object, if given
};

// Throws RefusedRequest (bad_field) naming the field: a malformed list or rule, or an option
// agentvm does not do (rules' header transforms, egressProxy, maskRequestHost, httpsPorts,
// allowPublicTraffic false).
std::optional<EgressRules> e2b_egress_rules(const E2bNetworkFields& fields);

// What getInfo shows of a sandbox's rules: allowInternetAccess, and network {allowOut, denyOut}.
bool e2b_internet_allowed(const std::optional<EgressRules>& rules);
Json e2b_network_json(const EgressRules& rules);

} // namespace agentvm
