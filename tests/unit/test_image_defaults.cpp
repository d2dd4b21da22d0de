// The guest init's reading of a template's defaults (/etc/agentvm/env and workdir): the
// files come from a user's image, so every malformed shape is skipped, never trusted.
#include <doctest/doctest.h>

#include <string>

#include "guest/image_defaults.hpp"

using agentvm::parse_image_env;
using agentvm::parse_image_workdir;
using namespace std::string_literals;

TEST_CASE("env entries are NUL-ended KEY=VALUE pairs; values keep '=', newlines and spaces")
{
    const auto parsed = parse_image_env("PATH=/opt/bin:/usr/bin\0A=b=c\0MULTI=line1\nline2\0EMPTY=\0"s);
    REQUIRE(parsed.entries.size() == 4);
    CHECK(parsed.entries[0] == std::pair<std::string, std::string>{"PATH", "/opt/bin:/usr/bin"});
    CHECK(parsed.entries[1] == std::pair<std::string, std::string>{"A", "b=c"});
    CHECK(parsed.entries[2].second == "line1\nline2");
    CHECK(parsed.entries[3] == std::pair<std::string, std::string>{"EMPTY", ""});
    CHECK(parsed.rejected.empty());
    CHECK(parse_image_env("").entries.empty());
}

TEST_CASE("malformed env entries are skipped and named, the rest kept")
{
    const auto parsed = parse_image_env("GOOD=1\0=nokey\0NOEQUALS\0CUT=half"s);
    REQUIRE(parsed.entries.size() == 1);
    CHECK(parsed.entries[0].first == "GOOD");
    REQUIRE(parsed.rejected.size() == 3);
    CHECK(parsed.rejected[0].find("=nokey") != std::string::npos);
    CHECK(parsed.rejected[1].find("NOEQUALS") != std::string::npos);
    CHECK(parsed.rejected[2].find("cut") != std::string::npos);
}

TEST_CASE("the workdir is an absolute path, one trailing newline allowed")
{
    CHECK(parse_image_workdir("/testbed") == "/testbed");
    CHECK(parse_image_workdir("/testbed\n") == "/testbed");
    CHECK(parse_image_workdir("relative") == "");
    CHECK(parse_image_workdir("") == "");
    CHECK(parse_image_workdir("/a\nb") == "");
    CHECK(parse_image_workdir("/a\0b"s) == "");
}
