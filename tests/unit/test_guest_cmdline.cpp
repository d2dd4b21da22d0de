// The guest init's command-line parsing: kernel-style word splitting and the base64 that
// carries agentvm.init_cmd through it.
#include <doctest/doctest.h>

#include "protocol/cmdline.hpp"
#include "common/base64.hpp"

using agentvm::base64_decode;
using agentvm::find_cmdline_param;
using agentvm::init_cmd_param;

TEST_CASE("base64 decodes RFC 4648 test vectors")
{
    CHECK(base64_decode("") == "");
    CHECK(base64_decode("Zg==") == "f");
    CHECK(base64_decode("Zm8=") == "fo");
    CHECK(base64_decode("Zm9v") == "foo");
    CHECK(base64_decode("Zm9vYg==") == "foob");
    CHECK(base64_decode("Zm9vYmE=") == "fooba");
    CHECK(base64_decode("Zm9vYmFy") == "foobar");
}

TEST_CASE("base64 keeps quotes, newlines and every byte value")
{
    // printf 'echo "a b"\nexit 3' | base64
    CHECK(base64_decode("ZWNobyAiYSBiIgpleGl0IDM=") == "echo \"a b\"\nexit 3");
    // The whole alphabet, '+' and '/' included: bytes 0xfb 0xff 0xbf and a NUL.
    std::optional<std::string> bytes = base64_decode("+/+/AA==");
    REQUIRE(bytes);
    CHECK(*bytes == std::string("\xfb\xff\xbf\0", 4));
}

TEST_CASE("base64 rejects malformed input")
{
    CHECK_FALSE(base64_decode("Zg"));        // padding missing
    CHECK_FALSE(base64_decode("Zg="));       // length not a multiple of 4
    CHECK_FALSE(base64_decode("Z==="));      // too much padding
    CHECK_FALSE(base64_decode("===="));
    CHECK_FALSE(base64_decode("Zg==Zm9v"));  // padding before the end
    CHECK_FALSE(base64_decode("Zm=v"));      // data after padding
    CHECK_FALSE(base64_decode("Zm9v-_8="));  // URL-safe alphabet
    CHECK_FALSE(base64_decode("Zm9 v"));
    CHECK_FALSE(base64_decode(std::string_view("Zm9\0", 4)));
}

TEST_CASE("finds a parameter among others, as /proc/cmdline shows them")
{
    std::string_view line = "console=ttyS0 reboot=t panic=-1 root=/dev/vda rw "
                            "init=/sbin/agentvm-init agentvm.init_cmd=ZWNobyBoaQ==\n";
    CHECK(find_cmdline_param(line, init_cmd_param) == "ZWNobyBoaQ==");
    CHECK(find_cmdline_param(line, "root") == "/dev/vda");
    CHECK(find_cmdline_param(line, "rw") == "");
    CHECK_FALSE(find_cmdline_param(line, "agentvm.init"));
    CHECK_FALSE(find_cmdline_param(line, "init_cmd"));
    CHECK_FALSE(find_cmdline_param("", init_cmd_param));
    CHECK_FALSE(find_cmdline_param(" \n", init_cmd_param));
}

TEST_CASE("splits and unquotes words like the kernel")
{
    CHECK(find_cmdline_param("a=\"x y\" b=2", "a") == "x y");
    CHECK(find_cmdline_param("\"a=x y\" b=2", "a") == "x y");
    CHECK(find_cmdline_param("a=x\"y z\" b=2", "a") == "x\"y z\"");
    CHECK(find_cmdline_param("a=\"unterminated b=2", "a") == "unterminated b=2");
    CHECK(find_cmdline_param("\ta=1\t\tb=2\n", "b") == "2");
    CHECK(find_cmdline_param("a==x", "a") == "=x");
}

TEST_CASE("the last occurrence wins and '-' matches '_' in names")
{
    CHECK(find_cmdline_param("agentvm.init_cmd=QQ== agentvm.init_cmd=Qg==", init_cmd_param) == "Qg==");
    CHECK(find_cmdline_param("agentvm.init-cmd=QQ==", init_cmd_param) == "QQ==");
}

TEST_CASE("words after -- belong to init, not the kernel")
{
    CHECK_FALSE(find_cmdline_param("quiet -- agentvm.init_cmd=QQ==", init_cmd_param));
    CHECK(find_cmdline_param("agentvm.init_cmd=QQ== -- x", init_cmd_param) == "QQ==");
    // Only a bare "--" ends them.
    CHECK(find_cmdline_param("--=1 agentvm.init_cmd=QQ==", init_cmd_param) == "QQ==");
}

TEST_CASE("agentvm.serve is a bare flag: present means serve the agent only")
{
    CHECK(find_cmdline_param("quiet agentvm.serve root=/dev/vda", agentvm::serve_param) == "");
    CHECK_FALSE(find_cmdline_param("quiet agentvm.serves", agentvm::serve_param));
    CHECK_FALSE(find_cmdline_param("quiet -- agentvm.serve", agentvm::serve_param));
}

TEST_CASE("agentvm.pids_max takes 1 to 4194304, decimal digits only")
{
    using agentvm::parse_pids_max;
    CHECK(parse_pids_max("1") == 1u);
    CHECK(parse_pids_max("1024") == 1024u);
    CHECK(parse_pids_max("4194304") == 4194304u);
    CHECK_FALSE(parse_pids_max("0"));
    CHECK_FALSE(parse_pids_max("4194305"));
    CHECK_FALSE(parse_pids_max("99999999999"));
    CHECK_FALSE(parse_pids_max(""));
    CHECK_FALSE(parse_pids_max("max"));
    CHECK_FALSE(parse_pids_max("-1"));
    CHECK_FALSE(parse_pids_max("12 "));
    CHECK_FALSE(parse_pids_max("0x10"));
    CHECK(find_cmdline_param("console=ttyS0 agentvm.pids_max=64 quiet", agentvm::pids_max_param) == "64");
}
