// How deep arrays and objects may nest in JSON agentvm takes from others. nlohmann's parser
// builds a tree of any depth without recursing (it keeps its own stack, and destroys a tree
// with one too), but copying, dumping and walking a tree recurse: a body nested half a million
// deep overflows the stack there. So nesting is bounded before anything is parsed.
#pragma once

#include <cstddef>
#include <string_view>

namespace agentvm {

// No line of the protocol and no request of serve's API nests deeper; the episode relay
// refuses deeper lines from the agent, serve deeper request bodies.
inline constexpr size_t max_json_depth = 64;

// False when arrays and objects in `text` nest deeper than `max_depth`. A linear scan over the
// bytes that skips strings, no parse: exact for valid JSON, and for invalid JSON exact up to
// the first error, which is where a parser stops building.
bool json_depth_within(std::string_view text, size_t max_depth = max_json_depth);

} // namespace agentvm
