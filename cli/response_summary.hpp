// What the episode relay must know of each line the agent sends: whose call it is about and
// whether it ends the call. Read with a SAX pass, so a response carrying megabytes of output
// is scanned once and never built into a JSON tree.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace agentvm {

struct ResponseSummary {
    // The top-level "id" as compact JSON text ("7", "\"a\"", "null"), comparable with
    // Json::dump() of the request's id; nullopt when absent or not a scalar.
    std::optional<std::string> id;
    bool is_event = false;  // has an "event" member: more lines about this call follow
};

// nullopt when the line is not a JSON object.
std::optional<ResponseSummary> summarize_response(std::string_view line);

// The "id" of a line still arriving, from its first bytes, as compact JSON like
// ResponseSummary::id: the agent writes every line as {"id":<string or number>,... (compact,
// "id" first). nullopt until the id has arrived whole, or when the line does not start so.
std::optional<std::string> leading_id(std::string_view partial_line);

} // namespace agentvm
