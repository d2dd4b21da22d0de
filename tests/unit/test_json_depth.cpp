// The nesting bound serve puts on request bodies before parsing them (protocol/json_depth.hpp):
// max_json_depth levels pass, one more does not, and brackets inside strings do not count.
#include <doctest/doctest.h>

#include <string>

#include "protocol/response_scanner.hpp"
#include "protocol/json_depth.hpp"

using namespace agentvm;

namespace {

std::string nested(size_t depth, char open = '[', char close = ']')
{
    return std::string(depth, open) + std::string(depth, close);
}

} // namespace

TEST_CASE("nesting up to max_json_depth passes, one level more does not")
{
    CHECK(json_depth_within(""));
    CHECK(json_depth_within("{\"a\":1}"));
    CHECK(json_depth_within(nested(max_json_depth)));
    CHECK_FALSE(json_depth_within(nested(max_json_depth + 1)));
    CHECK_FALSE(json_depth_within(nested(500000)));
    // Objects count as arrays do, and so does a mix.
    std::string objects;
    for (size_t i = 0; i <= max_json_depth; ++i)
        objects += i % 2 ? "[" : "{\"k\":";
    CHECK_FALSE(json_depth_within(objects));
    // Depth is how deep, not how many: siblings do not add up.
    std::string siblings = "[";
    for (size_t i = 0; i < 1000; ++i)
        siblings += nested(max_json_depth - 1) + ",";
    CHECK(json_depth_within(siblings + "0]"));
}

TEST_CASE("brackets in strings are text, escaped quotes included")
{
    CHECK(json_depth_within("[\"" + std::string(1000, '[') + "\"]"));
    CHECK(json_depth_within("[\"\\\"" + std::string(1000, '{') + "\"]"));
    CHECK(json_depth_within("[\"\\\\\"]"));
    // After an escaped backslash the quote ends the string: the brackets after it count.
    CHECK_FALSE(json_depth_within("[\"\\\\\"," + nested(max_json_depth) + "]"));
    // An unterminated string hides what follows, as it would from a parser (which refuses it).
    CHECK(json_depth_within("\"" + nested(500)));
}

TEST_CASE("the relay's limit on the agent's lines is the same one")
{
    CHECK(ResponseScanner::max_depth == max_json_depth);
}
