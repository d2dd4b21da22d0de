// The body of POST /v1/sandboxes (docs/api.md, "Create a sandbox"), checked field by field.
#pragma once

#include <string>

#include "service/sandbox.hpp"

namespace agentvm {

struct CreateRequest {
    std::string pool;  // empty: the default pool
    Sandbox::Settings settings;
};

inline constexpr int max_sandbox_timeout_s = 86400;
inline constexpr size_t max_metadata_entries = 64;

// A sandbox's timeout or idle_timeout: seconds from 1 to max_sandbox_timeout_s, rounded.
// Throws RefusedRequest (bad_json, bad_field) naming the field.
std::chrono::seconds sandbox_seconds(const Json& value, const char* name);

// {"allow": [...], "deny": [...]}, each rule checked (egress_policy.hpp). Throws RefusedRequest
// (bad_field) naming the rule at fault.
EgressRules parse_egress_field(const Json& value);

// Throws RefusedRequest (bad_json, bad_field) naming the field at fault.
CreateRequest parse_create_request(const std::string& body);

} // namespace agentvm
