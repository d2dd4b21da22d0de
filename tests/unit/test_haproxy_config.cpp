// The fleet's front-door configuration (service/fleet/haproxy_config.hpp) and its nodes
// (service/fleet/fleet_nodes.hpp). HAProxy itself runs what it makes in
// tests/service/fleet_routing_check.py; these check the text and the refusals.
#include <doctest/doctest.h>

#include <string>

#include "common/error.hpp"
#include "service/fleet/fleet_nodes.hpp"
#include "service/fleet/haproxy_config.hpp"

using namespace agentvm;

namespace {

FleetNode node(const char* id, const char* host, uint16_t port, std::optional<uint16_t> agent = std::nullopt)
{
    return FleetNode{id, host, port, agent};
}

size_t count(const std::string& text, const std::string& what)
{
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
        ++n;
    return n;
}

// The lines of `text` from "backend NAME" to the next blank line.
std::string backend(const std::string& text, const std::string& name)
{
    const size_t start = text.find("\nbackend " + name + "\n");
    REQUIRE(start != std::string::npos);
    const size_t end = text.find("\n\n", start + 1);
    return text.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

} // namespace

TEST_CASE("a node is ID=HOST:PORT with a node id, a host and a port")
{
    const FleetNode n = parse_node_spec("gpu-rack3-n12=10.0.0.7:8080");
    CHECK(n.id == "gpu-rack3-n12");
    CHECK(n.host == "10.0.0.7");
    CHECK(n.port == 8080);
    const FleetNode v6 = parse_node_spec("n2=[fd00::2]:9000");
    CHECK(v6.host == "fd00::2");
    CHECK(host_port_text(v6.host, v6.port) == "[fd00::2]:9000");
    CHECK(parse_node_spec("h1=h1.cluster.local:1").host == "h1.cluster.local");
    for (const char* bad : {"n1", "N1=10.0.0.1:80", "n--1=a:80", "n1=10.0.0.1", "n1=10.0.0.1:0", "n1=10.0.0.1:65536",
                            "n1=:80", "n1=fd00::2:80", "n1=[fd00::2:80", "n1=a b:80", "n1=a\"b:80", "n1=a:80x"})
        CHECK_THROWS_AS_MESSAGE(parse_node_spec(bad), Error, bad);
}

TEST_CASE("a fleet has nodes, each id and each address once")
{
    CHECK(fleet_nodes_problem({}).find("no nodes") != std::string::npos);
    CHECK(fleet_nodes_problem({node("n1", "a", 80), node("n2", "b", 80)}).empty());
    CHECK(fleet_nodes_problem({node("n1", "a", 80), node("n1", "b", 80)}).find("named twice") != std::string::npos);
    CHECK(fleet_nodes_problem({node("n1", "a", 80), node("n2", "a", 80)}).find("one serve is one node")
          != std::string::npos);
    CHECK(fleet_nodes_problem({node("n1", "a", 80, 80)}).find("port of its own") != std::string::npos);
    CHECK(fleet_nodes_problem({node("Bad_Id", "a", 80)}).find("not a node id") != std::string::npos);
}

TEST_CASE("Slurm's node list: names in order, each NodeAddr, the name when Slurm gives none")
{
    const auto names = text_lines("h1\nh2\n\n  h3  \n");
    REQUIRE(names == std::vector<std::string>{"h1", "h2", "h3"});
    const std::string shown = "NodeName=h2 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.9.0.2 NodeHostName=h2 Port=6819\n"
                              "NodeName=h1 Arch=x86_64 NodeAddr=10.9.0.1 NodeHostName=h1\n"
                              "NodeName=h3 Arch=x86_64 NodeHostName=h3\n";
    const auto addresses = slurm_node_addresses(names, shown);
    REQUIRE(addresses.size() == 3);
    CHECK(addresses[0] == std::pair<std::string, std::string>{"h1", "10.9.0.1"});
    CHECK(addresses[1] == std::pair<std::string, std::string>{"h2", "10.9.0.2"});
    CHECK(addresses[2] == std::pair<std::string, std::string>{"h3", "h3"});
}

TEST_CASE("the peers file names every node with its URL")
{
    CHECK(peers_file_text({node("n1", "10.0.0.1", 8080), node("n2", "fd00::2", 8080)}).ends_with(
        "n1=http://10.0.0.1:8080\nn2=http://[fd00::2]:8080\n"));
}

TEST_CASE("the configuration routes a sandbox's requests to the node its id names")
{
    HaproxySettings settings;
    settings.nodes = {node("n1", "10.0.0.1", 8080), node("gpu-rack3-n12", "10.0.0.2", 8080)};
    settings.bind_host = "127.0.0.1";
    settings.bind_port = 9000;
    const std::string text = haproxy_config(settings);
    CHECK(text.find("    bind 127.0.0.1:9000\n") != std::string::npos);
    // The id: "<node>-<6 hex>-<16 hex>", from the header or the path, and its node by field(-3,-,0).
    CHECK(text.find("acl id_in_header req.hdr(E2b-Sandbox-Id) -m reg ^[a-z0-9-]{1,32}-[0-9a-f]{6}-[0-9a-f]{16}$")
          != std::string::npos);
    CHECK(text.find("acl id_in_path path_reg ^/(v1/|v2/)?sandboxes/[a-z0-9-]{1,32}-[0-9a-f]{6}-[0-9a-f]{16}(/|$)")
          != std::string::npos);
    CHECK(text.find("var(txn.sandbox),field(-3,-,0)") != std::string::npos);
    const std::string routed = backend(text, "sandbox_native");
    CHECK(routed.find("use-server %[var(txn.node)] if { var(txn.node) -m found }") != std::string::npos);
    // Liveness only, no agent and no /healthz: a draining or full node keeps its sandboxes' requests.
    CHECK(routed.find("server gpu-rack3-n12 10.0.0.2:8080 check inter 1s") != std::string::npos);
    CHECK(routed.find("agent") == std::string::npos);
    CHECK(routed.find("httpchk") == std::string::npos);
    CHECK(routed.find("retry-on conn-failure\n") != std::string::npos);
    CHECK(routed.find("\"error\\\":\\\"sandbox_lost\\\"") != std::string::npos);
    CHECK(backend(text, "sandbox_e2b").find("track sandbox_native/n1") != std::string::npos);
    CHECK(backend(text, "sandbox_e2b").find("{\\\"code\\\":502,\\\"message\\\":\\\"sandbox_lost: ")
          != std::string::npos);
    // No agent port given: no agent lines, and no backup twins (weights never reach 0).
    CHECK(text.find("agent-check") == std::string::npos);
    CHECK(text.find("_full") == std::string::npos);
    CHECK(text.find("stats socket") == std::string::npos);
}

TEST_CASE("balanced requests: random(2) over agent weights, marked, retried on 503, 429 when all were full")
{
    HaproxySettings settings;
    settings.nodes = {node("n1", "10.0.0.1", 8080, 8081), node("n2", "10.0.0.2", 8080, 8081)};
    settings.stats_socket = "/run/haproxy-agentvm.sock";
    const std::string text = haproxy_config(settings);
    CHECK(text.find("    stats socket /run/haproxy-agentvm.sock mode 600 level admin\n") != std::string::npos);
    CHECK(text.find("http-request del-header Agentvm-Front-Door\n    http-request set-header Agentvm-Front-Door 1 if "
                    "!routed\n")
          != std::string::npos);
    const std::string native = backend(text, "balanced_native");
    CHECK(native.find("balance random(2)") != std::string::npos);
    CHECK(native.find("server n1 10.0.0.1:8080 check inter 1s fastinter 250ms downinter 1s fall 2 rise 2 weight 100 "
                      "agent-check agent-port 8081 agent-inter 1s")
          != std::string::npos);
    CHECK(native.find("server n2_full 10.0.0.2:8080 backup track balanced_native/n2 weight 100") != std::string::npos);
    CHECK(native.find("http-check expect status 200") != std::string::npos);
    CHECK(native.find("Bearer ${AGENTVM_TOKEN}") != std::string::npos);
    for (const char* name : {"balanced_native", "balanced_e2b", "balanced_fusion", "by_key_native", "by_key_e2b"}) {
        const std::string b = backend(text, name);
        CHECK_MESSAGE(b.find("retry-on conn-failure 503\n") != std::string::npos, name);
        CHECK_MESSAGE(b.find("option redispatch 1\n") != std::string::npos, name);
        CHECK_MESSAGE(b.find("option http-buffer-request\n") != std::string::npos, name);
        CHECK_MESSAGE(b.find("empty-response") == std::string::npos, name);
        CHECK_MESSAGE(b.find("http-response set-status 429 if { status 503 } { res.hdr(Agentvm-Refusal) -m str "
                             "at_capacity }")
                          != std::string::npos,
                      name);
    }
    // Each balanced backend asks the agent for its weight (track passes no weight on).
    CHECK(backend(text, "balanced_fusion").find("track balanced_native/n1 weight 100 agent-check agent-port 8081")
          != std::string::npos);
    CHECK(backend(text, "balanced_fusion").find("\\\"status\\\":\\\"SandboxError\\\"") != std::string::npos);
    // Keyed creates: a key's node depends on the set of up nodes only.
    const std::string keyed = backend(text, "by_key_native");
    CHECK(keyed.find("balance hdr(Idempotency-Key)\n    hash-type consistent\n") != std::string::npos);
    CHECK(keyed.find("agent-check") == std::string::npos);
    CHECK(keyed.find("hash-balance-factor") == std::string::npos);
    CHECK(count(text, "\nbackend ") == 7);
}

TEST_CASE("what cannot make a configuration is refused, naming the problem")
{
    HaproxySettings settings;
    CHECK_THROWS_WITH_AS(haproxy_config(settings), doctest::Contains("no nodes"), Error);
    settings.nodes = {node("n1", "a", 80)};
    settings.stats_socket = "relative.sock";
    CHECK_THROWS_WITH_AS(haproxy_config(settings), doctest::Contains("absolute"), Error);
    settings.stats_socket = "/run/a b.sock";
    CHECK_THROWS_AS(haproxy_config(settings), Error);
    settings.stats_socket.reset();
    settings.bind_host = "a b";
    CHECK_THROWS_AS(haproxy_config(settings), Error);
    settings.bind_host = "0.0.0.0";
    settings.made_by = "agentvm fleet haproxy-config\nglobal\n  evil";
    const std::string text = haproxy_config(settings);
    CHECK(text.find("# Made by: agentvm fleet haproxy-config global   evil\n") != std::string::npos);
}
