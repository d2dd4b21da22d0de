// Fleet-wide listing's pure parts (docs/api.md, "Listing across a fleet"): the peer list
// (service/fleet/peers.hpp), the native merge and the unreached header
// (service/fleet/peer_listing.hpp), and E2B's merged page (service/e2b/e2b_fleet_list.hpp).
#include <doctest/doctest.h>

#include <map>
#include <string>

#include <fmt/format.h>

#include "common/error.hpp"
#include "service/e2b/e2b_fleet_list.hpp"
#include "service/fleet/peer_listing.hpp"
#include "service/fleet/peers.hpp"

using namespace agentvm;

TEST_CASE("a peer is NODE=http://HOST:PORT")
{
    const Peer peer = parse_peer("n2=http://10.0.0.2:8080/");
    CHECK(peer.node == "n2");
    CHECK(peer.url == "http://10.0.0.2:8080");
    CHECK(parse_peer("gpu-7=http://gpu-7.cluster.local:80").url == "http://gpu-7.cluster.local:80");
    CHECK(parse_peer("v6=http://[fd00::2]:8080").url == "http://[fd00::2]:8080");
    for (const char* bad : {"n2", "=http://h:1", "N2=http://h:1", "n--2=http://h:1", "n2=https://h:1",
                            "n2=http://h", "n2=http://h:0", "n2=http://h:65536", "n2=http://h:80/v1",
                            "n2=http://u@h:80", "n2=http://h:80?x", "n2=http://:80", "n2=http://h h:80",
                            "n2=http://[fd00::2]", "n2=http://[zz]:80", "n2=http://h:8o"})
        CHECK_THROWS_AS_MESSAGE(parse_peer(bad), Error, bad);
}

TEST_CASE("a peers file: one a line, comments and blank lines skipped, errors name the line")
{
    const std::vector<Peer> peers =
        parse_peers_text("# the fleet\n\nn1=http://10.0.0.1:8080\n  n2=http://10.0.0.2:8080   # rack 2\r\n", "f");
    REQUIRE(peers.size() == 2);
    CHECK(peers[0].node == "n1");
    CHECK(peers[1].url == "http://10.0.0.2:8080");
    try {
        parse_peers_text("n1=http://a:1\nn2=ftp://b:2\n", "--peers-file x");
        FAIL("a bad line was taken");
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find("--peers-file x, line 2") != std::string::npos);
    }
}

TEST_CASE("peers_besides drops this node and refuses a node or URL named twice")
{
    const std::vector<Peer> all = {{"n1", "http://a:1"}, {"n2", "http://b:1"}, {"n3", "http://c:1"}};
    const std::vector<Peer> others = peers_besides(all, "n2");
    REQUIRE(others.size() == 2);
    CHECK(others[0].node == "n1");
    CHECK(others[1].node == "n3");
    CHECK(peers_besides(all, "n9").size() == 3);
    CHECK_THROWS_AS(peers_besides({{"n1", "http://a:1"}, {"n1", "http://b:1"}}, "n9"), Error);
    CHECK_THROWS_AS(peers_besides({{"n1", "http://a:1"}, {"n2", "http://a:1"}}, "n9"), Error);
}

namespace {

PeerAnswer ok(const std::string& node, const std::string& body, std::optional<std::string> next = std::nullopt)
{
    return PeerAnswer{node, "", 200, body, std::move(next)};
}

} // namespace

TEST_CASE("peer_json: a 200 of JSON no deeper than the bound, else why not")
{
    std::string problem;
    CHECK(peer_json(ok("n2", "[1]"), problem) == Json::array({1}));
    CHECK_FALSE(peer_json(PeerAnswer{"n2", "could not connect", 0, "", std::nullopt}, problem));
    CHECK(problem == "could not connect");
    CHECK_FALSE(peer_json(PeerAnswer{"n2", "", 401, "{}", std::nullopt}, problem));
    CHECK(problem == "answered HTTP 401");
    CHECK_FALSE(peer_json(ok("n2", "nope"), problem));
    CHECK(problem == "its answer is not JSON");
    CHECK_FALSE(peer_json(ok("n2", std::string(100, '[') + std::string(100, ']')), problem));
    CHECK(problem.find("deeper than") != std::string::npos);
}

TEST_CASE("the native merge: this node's sandboxes, then each peer's; bad answers named")
{
    const Json local = Json::array({Json{{"id", "n1-a"}}, Json{{"id", "n1-b"}}});
    std::vector<Unreached> unreached;
    const Json merged = merge_native_lists(
        local,
        {ok("n2", R"({"sandboxes":[{"id":"n2-a"},{"id":"n1-a"}]})"), ok("n3", R"({"sandboxes":5})"),
         ok("n4", R"({"sandboxes":[{"id":7}]})"), PeerAnswer{"n5", "no whole answer within 5 s", 0, "", std::nullopt},
         ok("n6", R"({"sandboxes":[{"id":"n6-a"}]})")},
        unreached);
    std::vector<std::string> ids;
    for (const Json& sandbox : merged["sandboxes"])
        ids.push_back(sandbox["id"].get<std::string>());
    CHECK(ids == std::vector<std::string>{"n1-a", "n1-b", "n2-a", "n6-a"});
    REQUIRE(unreached.size() == 3);
    CHECK(unreached[0].node == "n3");
    CHECK(unreached[0].problem == "its answer is not a list of sandboxes");
    CHECK(unreached[1].node == "n4");
    CHECK(unreached[2].problem == "no whole answer within 5 s");
    CHECK(merged["unreached"].size() == 3);
    CHECK(merged["unreached"][2] == Json{{"node", "n5"}, {"problem", "no whole answer within 5 s"}});
}

TEST_CASE("the unreached header: one line, one entry a node, split back by '; '")
{
    CHECK(unreached_text({}) == "");
    CHECK(unreached_text({{"n2", "could not connect"}, {"n3", "bad; worse\r\nX-Evil: 1"}})
          == "n2 (could not connect); n3 (bad, worse??X-Evil: 1)");
    CHECK(unreached_text({{"n2", std::string(1000, 'x')}}).size() == std::string("n2 ()").size() + 200);
}

namespace {

// A ListedSandbox as e2b_listed_json writes it, with the fields the merge reads.
Json listed(const std::string& id, int second)
{
    return Json{{"sandboxID", id}, {"startedAt", fmt::format("2026-12-01T10:00:{:02}.000Z", second)}};
}

E2bListed local_entry(const std::string& id, int second)
{
    Json entry = listed(id, second);
    return E2bListed{*e2b_listed_key(entry), entry};
}

std::vector<std::string> ids_of(const Json& entries)
{
    std::vector<std::string> ids;
    for (const Json& entry : entries)
        ids.push_back(entry["sandboxID"].get<std::string>());
    return ids;
}

} // namespace

TEST_CASE("E2B's merged page: the first `limit` of every node's, in order, with the next token")
{
    const Json n2 = Json::array({listed("n2-a", 5), listed("n2-b", 3)});
    std::vector<Unreached> unreached;
    SUBCASE("newest first, cut at the limit: the token is the last entry's key")
    {
        const E2bFleetPage page = merge_e2b_lists({local_entry("n1-a", 4), local_entry("n1-b", 1)}, false,
                                                  {ok("n2", n2.dump())}, false, 3, unreached);
        CHECK(ids_of(page.entries) == std::vector<std::string>{"n2-a", "n1-a", "n2-b"});
        REQUIRE(page.next_token);
        CHECK(parse_page_token(*page.next_token) == *e2b_listed_key(listed("n2-b", 3)));
        CHECK(unreached.empty());
    }
    SUBCASE("oldest first, all of it: no token")
    {
        const E2bFleetPage page = merge_e2b_lists({local_entry("n1-a", 4)}, false, {ok("n2", n2.dump())}, true, 10,
                                                  unreached);
        CHECK(ids_of(page.entries) == std::vector<std::string>{"n2-b", "n1-a", "n2-a"});
        CHECK_FALSE(page.next_token);
    }
    SUBCASE("a page exactly full while a peer had more still gets a token")
    {
        const E2bFleetPage page =
            merge_e2b_lists({}, false, {ok("n2", n2.dump(), "peer-token")}, false, 2, unreached);
        CHECK(ids_of(page.entries) == std::vector<std::string>{"n2-a", "n2-b"});
        REQUIRE(page.next_token);
        CHECK(parse_page_token(*page.next_token) == *e2b_listed_key(listed("n2-b", 3)));
    }
    SUBCASE("so does one where this node had more")
    {
        const E2bFleetPage page = merge_e2b_lists({local_entry("n1-a", 4)}, true, {}, false, 1, unreached);
        CHECK(page.next_token);
    }
    SUBCASE("a peer's bad answer is named, the rest is merged")
    {
        const E2bFleetPage page = merge_e2b_lists(
            {local_entry("n1-a", 4)}, false,
            {ok("n2", R"([{"sandboxID":"x"}])"), ok("n3", R"({"a":1})"), ok("n4", n2.dump()),
             PeerAnswer{"n5", "", 503, "", std::nullopt}},
            false, 100, unreached);
        CHECK(ids_of(page.entries) == std::vector<std::string>{"n2-a", "n1-a", "n2-b"});
        REQUIRE(unreached.size() == 3);
        CHECK(unreached[0].node == "n2");
        CHECK(unreached[1].problem == "its answer is not a list of sandboxes");
        CHECK(unreached[2].problem == "answered HTTP 503");
    }
}

TEST_CASE("E2B's list target: the caller's list arguments, encoded again")
{
    const std::map<std::string, std::string> args = {
        {"metadata", "team=blue&x=a%20b"}, {"limit", "5"}, {"nextToken", "abc+/="}, {"other", "dropped"}};
    const std::string target = e2b_list_target([&](const char* name) -> std::optional<std::string> {
        const auto it = args.find(name);
        return it == args.end() ? std::nullopt : std::optional<std::string>(it->second);
    });
    CHECK(target == "/v2/sandboxes?metadata=team%3Dblue%26x%3Da%2520b&limit=5&nextToken=abc%2B%2F%3D");
    CHECK(e2b_list_target([](const char*) { return std::nullopt; }) == "/v2/sandboxes");
}
