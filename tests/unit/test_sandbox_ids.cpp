// Sandbox ids that name their node and serve instance (service/sandbox_ids.hpp).
#include <doctest/doctest.h>

#include <set>

#include "service/sandbox_ids.hpp"

using namespace agentvm;

TEST_CASE("node ids: DNS-label-like, lower case, without a double hyphen")
{
    for (const char* good : {"h1", "node-017", "a", "gpu-rack3-n12"})
        CHECK_MESSAGE(node_id_problem(good).empty(), good);
    for (const char* bad : {"", "Node1", "-h1", "h1-", "h--1", "h_1", "h.1", "h 1"})
        CHECK_MESSAGE(!node_id_problem(bad).empty(), bad);
    CHECK(node_id_problem(std::string(max_node_id, 'n')).empty());
    CHECK(!node_id_problem(std::string(max_node_id + 1, 'n')).empty());
}

TEST_CASE("a new id names its node and instance, and parses back; anything else does not parse")
{
    const std::string instance = new_instance_id();
    CHECK(instance.size() == instance_hex);
    std::set<std::string> seen;
    for (int i = 0; i < 100; ++i) {
        const std::string id = new_sandbox_id("gpu-rack3-n12", instance);
        seen.insert(id);
        const auto parts = parse_sandbox_id(id);
        REQUIRE(parts);
        CHECK(parts->node == "gpu-rack3-n12");
        CHECK(parts->instance == instance);
    }
    CHECK(seen.size() == 100);
    for (const char* bad : {"sb-0123456789abcdef", "h1-abc123-0123456789abcde", "h1-ABC123-0123456789abcdef",
                            "h1-abc1230123456789abcdef0", "-abc123-0123456789abcdef", "H1-abc123-0123456789abcdef",
                            "h1-abc123-0123456789abcdeg", "abc123-0123456789abcdef", ""})
        CHECK_MESSAGE(!parse_sandbox_id(bad), bad);
}

TEST_CASE("an id serve does not have is lost when it names another node or an earlier serve of this one")
{
    const std::string here = "h1";
    const std::string instance = "abc123";
    CHECK(!lost_sandbox(new_sandbox_id(here, instance), here, instance));
    CHECK(!lost_sandbox("sb-0123456789abcdef", here, instance));
    CHECK(!lost_sandbox("", here, instance));

    const auto elsewhere = lost_sandbox(new_sandbox_id("gpu-n2", instance), here, instance);
    REQUIRE(elsewhere);
    CHECK(elsewhere->code == ServiceError::sandbox_lost);
    CHECK(elsewhere->node == "gpu-n2");
    CHECK(elsewhere->message.find("node gpu-n2") != std::string::npos);
    CHECK(elsewhere->message.find("node h1 did") != std::string::npos);

    const auto restarted = lost_sandbox(new_sandbox_id(here, "0ff1ce"), here, instance);
    REQUIRE(restarted);
    CHECK(restarted->code == ServiceError::sandbox_lost);
    CHECK(restarted->node == here);
    CHECK(restarted->message.find("restarted") != std::string::npos);
    CHECK(restarted->message.find("0ff1ce") != std::string::npos);
}

TEST_CASE("a host name becomes a node id: first label, lower case, other characters a '-'")
{
    CHECK(node_id_from_host_name("gpu-07.cluster.example") == "gpu-07");
    CHECK(node_id_from_host_name("GPU_07") == "gpu-07");
    CHECK(node_id_from_host_name("(none)") == "none");
    CHECK(node_id_from_host_name("a__b--c") == "a-b-c");
    CHECK(node_id_from_host_name("") == "node");
    CHECK(node_id_from_host_name("___") == "node");
    CHECK(node_id_from_host_name(std::string(40, 'x')) == std::string(32, 'x'));
    CHECK(node_id_from_host_name(std::string(31, 'x') + "_y") == std::string(31, 'x'));
    for (const char* host : {"gpu-07", "GPU_07", "(none)", "a__b--c", "", "-x-", "日本"}) {
        INFO(host);
        CHECK(node_id_problem(node_id_from_host_name(host)).empty());
    }
}
