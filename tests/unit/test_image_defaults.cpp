// The guest init's reading of a template's defaults (/etc/agentvm/env and workdir): the
// files come from a user's image, so every malformed shape is skipped, never trusted.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "guest/image_defaults.hpp"
#include "guest/read_file.hpp"

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

TEST_CASE("init reads small files whole, refusing one too large or behind a symlink")
{
    char dir[] = "/tmp/agentvm-read-file-XXXXXX";
    REQUIRE(::mkdtemp(dir));
    const std::string file = std::string(dir) + "/f";
    const std::string link = std::string(dir) + "/l";
    {
        std::FILE* f = std::fopen(file.c_str(), "w");
        REQUIRE(f);
        std::fputs("0123456789", f);
        std::fclose(f);
    }
    REQUIRE(::symlink(file.c_str(), link.c_str()) == 0);
    CHECK(agentvm::read_small_file(file.c_str(), 10) == "0123456789");
    CHECK(!agentvm::read_small_file(file.c_str(), 9));
    CHECK(errno == EFBIG);
    CHECK(!agentvm::read_small_file(link.c_str(), 100));
    CHECK(errno == ELOOP);
    CHECK(!agentvm::read_small_file((std::string(dir) + "/missing").c_str(), 100));
    CHECK(errno == ENOENT);
    ::unlink(link.c_str());
    ::unlink(file.c_str());
    ::rmdir(dir);
}

TEST_CASE("the user file is UID:GID with optional supplementary groups, exactly as the builder writes it")
{
    using agentvm::format_image_user;
    using agentvm::ImageUser;
    using agentvm::parse_image_user;
    const ImageUser plain{1000, 1001, {}};
    const ImageUser grouped{1000, 1001, {27, 100}};
    CHECK(format_image_user(plain) == "1000:1001\n");
    CHECK(format_image_user(grouped) == "1000:1001:27,100\n");
    CHECK(parse_image_user(format_image_user(plain)) == plain);
    CHECK(parse_image_user(format_image_user(grouped)) == grouped);
    CHECK(parse_image_user("0:0") == ImageUser{0, 0, {}});
    for (const char* bad : {"", "\n", "1000", "1000:", ":1000", "a:b", "-1:0", "+1:0", "1000:1000\n\n", "1000:1000:",
                            "1000:1000:1,", "1000:1000:,1", "1000 :1000", "4294967295:0", "0:4294967295",
                            "4294967296:0", "1000:1000:27:28"})
        CHECK_MESSAGE(!parse_image_user(bad), std::string(bad));
    CHECK(!parse_image_user("1000:1000\0x"s));
}
