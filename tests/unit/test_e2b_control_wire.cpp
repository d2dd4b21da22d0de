// E2B's control-plane wire (service/e2b/control_plane_wire.hpp) as the SDK e2b 2.51.0 speaks
// it: create's fields and the ones agentvm refuses naming them, the objects the SDK reads, ISO
// times, the list's thrice-encoded metadata filter and its paging tokens.
#include <doctest/doctest.h>

#include <map>
#include <string>

#include "service/e2b/control_plane_wire.hpp"
#include "service/problem.hpp"

using namespace agentvm;

namespace {

template <typename Parse>
std::string refusal(Parse&& parse)
{
    try {
        parse();
    } catch (const RefusedRequest& e) {
        return std::string(error_name(e.code)) + ": " + e.what();
    }
    return "accepted";
}

std::string create_refusal(const std::string& body)
{
    return refusal([&] { parse_e2b_create(Json::parse(body)); });
}

WallTime at_ms(int64_t ms)
{
    return WallTime(std::chrono::milliseconds(ms));
}

QueryArgument query(std::map<std::string, std::string> arguments)
{
    return [arguments](const char* name) -> std::optional<std::string> {
        auto it = arguments.find(name);
        return it == arguments.end() ? std::nullopt : std::optional<std::string>(it->second);
    };
}

} // namespace

TEST_CASE("create: the SDK's captured body, and the defaults")
{
    const E2bCreate create = parse_e2b_create(Json::parse(
        R"({"templateID":"base","metadata":{"suite":"e2b-compat","run":"r1"},"envVars":{"SBX_LEVEL":"from-create"},"timeout":120})"));
    CHECK(create.template_id == "base");
    CHECK(create.timeout == std::chrono::seconds(120));
    CHECK(create.metadata == Json{{"suite", "e2b-compat"}, {"run", "r1"}});
    CHECK(create.env == std::map<std::string, std::string>{{"SBX_LEVEL", "from-create"}});
    CHECK_FALSE(create.auto_pause);

    const E2bCreate bare = parse_e2b_create(Json::parse(R"({"templateID":"code-interpreter-v1"})"));
    CHECK(bare.timeout == e2b_default_timeout);
    CHECK(bare.env.empty());
    CHECK(bare.metadata == Json::object());

    const E2bCreate pausing = parse_e2b_create(
        Json::parse(R"({"templateID":"base","autoPause":true,"autoPauseMemory":true,"autoResume":{"enabled":false},
                        "allow_internet_access":false})"));
    CHECK(pausing.auto_pause);
}

TEST_CASE("create: each field type-checked, the message naming it")
{
    CHECK(create_refusal(R"({})") == "missing_field: \"templateID\" is required");
    CHECK(create_refusal(R"({"templateID":""})").starts_with("bad_field: \"templateID\""));
    CHECK(create_refusal(R"({"templateID":7})").starts_with("bad_field: \"templateID\""));
    CHECK(create_refusal(R"({"templateID":"base","timeout":"60"})").starts_with("bad_field: \"timeout\""));
    CHECK(create_refusal(R"({"templateID":"base","timeout":0})").starts_with("bad_field: \"timeout\""));
    CHECK(create_refusal(R"({"templateID":"base","timeout":1.5})").starts_with("bad_field: \"timeout\""));
    CHECK(create_refusal(R"({"templateID":"base","timeout":86401})").starts_with("bad_field: \"timeout\""));
    CHECK(create_refusal(R"({"templateID":"base","metadata":{"a":1}})").starts_with("bad_field: \"metadata\""));
    CHECK(create_refusal(R"({"templateID":"base","metadata":[]})").starts_with("bad_field: \"metadata\""));
    CHECK(create_refusal(R"({"templateID":"base","envVars":{"1X":"y"}})").starts_with("bad_field: \"envVars\""));
    CHECK(create_refusal(R"({"templateID":"base","envVars":{"X":2}})").starts_with("bad_field: \"envVars\""));
    CHECK(create_refusal(R"({"templateID":"base","autoPause":"yes"})").starts_with("bad_field: \"autoPause\""));
    CHECK(create_refusal(R"({"templateID":"base","autoResume":true})").starts_with("bad_field: \"autoResume\""));
    CHECK(create_refusal(R"({"templateID":"base","secure":true})").find("unknown field \"secure\"") != std::string::npos);
    CHECK(create_refusal(R"([1])").starts_with("bad_json"));
}

TEST_CASE("create: what agentvm does not do is refused, naming the field and saying so")
{
    for (const char* body : {R"({"templateID":"base","network":{"egressProxy":{"address":"p:1"}}})",
                             R"({"templateID":"base","network":{"rules":{"a.com":[]}}})",
                             R"({"templateID":"base","network":{"allowPublicTraffic":false}})",
                             R"({"templateID":"base","iam":{"tokens":{}}})",
                             R"({"templateID":"mcp-gateway","mcp":{}})",
                             R"({"templateID":"base","volumeMounts":[{"name":"v","path":"/v"}]})",
                             R"({"templateID":"base","autoPause":true,"autoPauseMemory":false})",
                             R"({"templateID":"base","autoPause":true,"autoResume":{"enabled":true}})"}) {
        CAPTURE(body);
        const std::string why = create_refusal(body);
        CHECK(why.starts_with("bad_field: \""));
        CHECK(why.find("agentvm does not do") != std::string::npos);
    }
    CHECK(create_refusal(R"({"templateID":"base","network":[]})").starts_with("bad_field: \"network\""));
    CHECK(create_refusal(R"({"templateID":"base","network":{"allowOut":"x"}})").starts_with("bad_field: \"network.allowOut\""));
    CHECK(create_refusal(R"({"templateID":"base","network":{"denyOut":["a..b"]}})").starts_with("bad_field: \"network\""));
    CHECK(create_refusal(R"({"templateID":"base","autoPauseMemory":false})").starts_with("bad_field: \"autoPauseMemory\""));
}

TEST_CASE("create: E2B's network options as egress rules")
{
    const auto rules = [](const char* body) { return parse_e2b_create(Json::parse(body)).egress; };
    CHECK_FALSE(rules(R"({"templateID":"base"})"));  // serve's default
    CHECK(rules(R"({"templateID":"base","allow_internet_access":true})") == EgressRules{{"*"}, {}});
    CHECK(rules(R"({"templateID":"base","allow_internet_access":false})") == EgressRules{});
    // The SDK's "only these": denyOut ALL_TRAFFIC with allowOut.
    CHECK(rules(R"({"templateID":"base","network":{"allowOut":["pypi.org","10.0.0.0/8"],"denyOut":["0.0.0.0/0"]}})") ==
          EgressRules{{"pypi.org", "10.0.0.0/8"}, {}});
    // Internet on (E2B's default once network is given) minus a range.
    CHECK(rules(R"({"templateID":"base","network":{"denyOut":["1.1.1.0/24"]}})") == EgressRules{{"*"}, {"1.1.1.0/24"}});
    CHECK(rules(R"({"templateID":"base","allow_internet_access":false,"network":{"allowOut":["a.org"]}})") ==
          EgressRules{{"a.org"}, {}});
}

TEST_CASE("connect, timeout, fork, pause and snapshot bodies")
{
    CHECK_FALSE(parse_e2b_connect(Json::object()).timeout);
    CHECK(parse_e2b_connect(Json::object()).memory);
    CHECK(parse_e2b_connect(Json{{"timeout", 30}}).timeout == std::chrono::seconds(30));
    CHECK_FALSE(parse_e2b_connect(Json{{"memory", false}}).memory);
    CHECK(refusal([] { parse_e2b_connect(Json{{"timeout", -1}}); }).starts_with("bad_field: \"timeout\""));
    CHECK(refusal([] { parse_e2b_connect(Json{{"memory", "no"}}); }).starts_with("bad_field: \"memory\""));

    CHECK(parse_e2b_set_timeout(Json{{"timeout", 60}}) == std::chrono::seconds(60));
    CHECK(refusal([] { parse_e2b_set_timeout(Json::object()); }) == "missing_field: \"timeout\" is required");

    CHECK(parse_e2b_fork(Json::object(), 64).count == 1);
    CHECK_FALSE(parse_e2b_fork(Json::object(), 64).timeout);
    CHECK(parse_e2b_fork(Json{{"count", 3}, {"timeout", 20}}, 64).count == 3);
    CHECK(refusal([] { parse_e2b_fork(Json{{"count", 65}}, 64); }).starts_with("bad_field: \"count\""));
    CHECK(refusal([] { parse_e2b_fork(Json{{"count", 0}}, 64); }).starts_with("bad_field: \"count\""));

    CHECK(refusal([] { parse_e2b_pause(Json::object()); }) == "accepted");
    CHECK(refusal([] { parse_e2b_pause(Json{{"memory", true}}); }) == "accepted");
    CHECK(refusal([] { parse_e2b_pause(Json{{"memory", false}}); }).starts_with("bad_field: \"memory\""));

    CHECK_FALSE(parse_e2b_snapshot_request(Json::object()));
    CHECK(parse_e2b_snapshot_request(Json{{"name", "my-snap:v1"}}) == "my-snap:v1");
    CHECK(refusal([] { parse_e2b_snapshot_request(Json{{"name", "a b"}}); }).starts_with("bad_field: \"name\""));
    CHECK(refusal([] { parse_e2b_snapshot_request(Json{{"name", 3}}); }).starts_with("bad_field: \"name\""));
}

TEST_CASE("the objects the SDK reads")
{
    E2bSandboxView view;
    view.id = "sb-1";
    view.template_id = "base";
    view.alias = "base";
    view.envd_token = "envd";
    view.traffic_token = "traffic";
    view.started_at = at_ms(1'796'000'000'123);
    view.end_at = at_ms(1'796'000'300'123);
    view.metadata = Json{{"k", "v"}};
    view.cpu_count = 2;
    view.memory_mb = 512;
    view.disk_mb = 684;
    view.pause_on_timeout = true;

    const Json sandbox = e2b_sandbox_json(view);
    CHECK(sandbox == Json{{"sandboxID", "sb-1"}, {"templateID", "base"}, {"clientID", "agentvm"},
                          {"envdVersion", "0.5.7"}, {"alias", "base"}, {"envdAccessToken", "envd"},
                          {"trafficAccessToken", "traffic"}, {"domain", nullptr}});

    const Json detail = e2b_detail_json(view);
    CHECK(detail["state"] == "running");
    CHECK(detail["startedAt"] == "2026-11-30T00:53:20.123Z");
    CHECK(detail["endAt"] == "2026-11-30T00:58:20.123Z");
    CHECK(detail["cpuCount"] == 2);
    CHECK(detail["memoryMB"] == 512);
    CHECK(detail["diskSizeMB"] == 684);
    CHECK(detail["lifecycle"] == Json{{"onTimeout", "pause"}, {"autoResume", false}});
    CHECK(detail["envdAccessToken"] == "envd");

    view.paused = true;
    const Json listed = e2b_listed_json(view);
    CHECK(listed["state"] == "paused");
    CHECK(listed["metadata"] == Json{{"k", "v"}});
    CHECK_FALSE(listed.contains("envdAccessToken"));
    CHECK_FALSE(listed.contains("lifecycle"));

    E2bMetric metric;
    metric.at = at_ms(1'796'000'000'000);
    metric.cpu_used_pct = 12.3456;
    metric.mem_total = 512u << 20;
    const Json m = e2b_metric_json(metric);
    CHECK(m["timestamp"] == "2026-11-30T00:53:20.000Z");
    CHECK(m["timestampUnix"] == 1'796'000'000);
    CHECK(m["cpuUsedPct"].get<double>() == doctest::Approx(12.35));
    CHECK(m["memTotal"] == 512u << 20);

    CHECK(e2b_fork_error_json(500, "no") == Json{{"error", {{"code", 500}, {"message", "no"}}}});
    CHECK(e2b_snapshot_json("snap-1", {"a"}) == Json{{"snapshotID", "snap-1"}, {"names", {"a"}}});
}

TEST_CASE("ISO times: written in UTC with milliseconds, read as the SDK writes them")
{
    CHECK(e2b_time(at_ms(0)) == "1970-01-01T00:00:00.000Z");
    CHECK(e2b_time(at_ms(-1)) == "1969-12-31T23:59:59.999Z");
    CHECK(parse_e2b_time("2026-11-30T00:53:20.123Z") == at_ms(1'796'000'000'123));
    CHECK(parse_e2b_time("2026-11-30T00:53:20Z") == at_ms(1'796'000'000'000));
    CHECK(parse_e2b_time("2026-11-30T02:53:20.5+02:00") == at_ms(1'796'000'000'500));
    CHECK(parse_e2b_time("2026-11-29T23:53:20-01:00") == at_ms(1'796'000'000'000));
    for (const char* bad : {"", "2026-11-29", "2026-11-29 00:53:20Z", "2026-13-29T00:53:20Z", "2026-11-30T00:53:20",
                            "2026-11-30T00:53:20.Z", "2026-11-30T00:53:20+0200", "x026-11-29T00:53:20Z"}) {
        CAPTURE(bad);
        CHECK_FALSE(parse_e2b_time(bad));
    }
    const WallTime now = at_ms(1'796'123'456'789);
    CHECK(parse_e2b_time(e2b_time(now)) == now);
}

TEST_CASE("the list's metadata filter: the captured URL decodes to the SDK's object")
{
    // GET /v2/sandboxes?metadata=a%252520b%3Dc%252526d%25253De, for {'a b': 'c&d=e'}: the
    // query's own decoding first (HttpExchange::query), then the filter's.
    const std::optional<std::string> argument = percent_decode("a%252520b%3Dc%252526d%25253De", true);
    REQUIRE(argument);
    CHECK(*argument == "a%2520b=c%2526d%253De");
    CHECK(decode_metadata_filter(*argument) == std::map<std::string, std::string>{{"a b", "c&d=e"}});

    CHECK(decode_metadata_filter("run=run-1&suite=e2b") ==
          std::map<std::string, std::string>{{"run", "run-1"}, {"suite", "e2b"}});
    CHECK(decode_metadata_filter("").empty());
    CHECK(decode_metadata_filter("k=") == std::map<std::string, std::string>{{"k", ""}});
    // A '+' the form carries is a space; one the SDK encoded (%2B) stays a '+'.
    CHECK(decode_metadata_filter("a+b=c%252Bd") == std::map<std::string, std::string>{{"a b", "c+d"}});
    CHECK(refusal([] { decode_metadata_filter("a=%zz"); }).starts_with("bad_field: \"metadata\""));
    CHECK(refusal([] { decode_metadata_filter("a=%2"); }).starts_with("bad_field: \"metadata\""));
    CHECK(refusal([] { decode_metadata_filter("=v"); }).starts_with("bad_field: \"metadata\""));
    CHECK_FALSE(percent_decode("%", false));
    CHECK_FALSE(percent_decode("ab%4", false));
}

TEST_CASE("the list's query")
{
    const E2bListQuery all = parse_e2b_list_query(query({}));
    CHECK(all.running);
    CHECK(all.paused);
    CHECK_FALSE(all.ascending);
    CHECK(all.limit == e2b_default_page);
    CHECK_FALSE(all.after);

    const E2bListQuery some = parse_e2b_list_query(query({{"state", "paused"},
                                                          {"order", "asc"},
                                                          {"limit", "5"},
                                                          {"template", "base"},
                                                          {"startedAfter", "2026-11-30T00:53:20.000Z"}}));
    CHECK_FALSE(some.running);
    CHECK(some.paused);
    CHECK(some.ascending);
    CHECK(some.limit == 5);
    CHECK(some.template_id == "base");
    CHECK(some.started_after == at_ms(1'796'000'000'000));
    CHECK(parse_e2b_list_query(query({{"state", "running,paused"}})).paused);

    CHECK(refusal([] { parse_e2b_list_query(query({{"state", "running,dead"}})); }).starts_with("bad_field: \"state\""));
    CHECK(refusal([] { parse_e2b_list_query(query({{"limit", "0"}})); }).starts_with("bad_field: \"limit\""));
    CHECK(refusal([] { parse_e2b_list_query(query({{"limit", "1001"}})); }).starts_with("bad_field: \"limit\""));
    CHECK(refusal([] { parse_e2b_list_query(query({{"limit", "ten"}})); }).starts_with("bad_field: \"limit\""));
    CHECK(refusal([] { parse_e2b_list_query(query({{"order", "up"}})); }).starts_with("bad_field: \"order\""));
    CHECK(refusal([] { parse_e2b_list_query(query({{"startedAfter", "yesterday"}})); })
              .starts_with("bad_field: \"startedAfter\""));
    CHECK(refusal([] { parse_e2b_list_query(query({{"nextToken", "abc"}})); }).starts_with("bad_field: \"nextToken\""));
}

TEST_CASE("paging: tokens serve made round-trip, others are refused")
{
    const PageKey key{1'796'000'000'123, "sb-0123456789abcdef"};
    CHECK(parse_page_token(page_token(key)) == key);
    for (const char* bad : {"", "abc", "YWJj", "YWdlbnR2bS1wYWdlOnYxOg==" /* "agentvm-page:v1:" */}) {
        CAPTURE(bad);
        CHECK(refusal([&] { parse_page_token(bad); }).starts_with("bad_field: \"nextToken\""));
    }
}

TEST_CASE("paging: pages in order, each starting after the last one's key")
{
    // Started at 30, 10, 20, 20 (the ties ordered by id).
    const std::vector<PageKey> keys{{30, "c"}, {10, "a"}, {20, "b2"}, {20, "b1"}};

    Page first = page_of(keys, false, std::nullopt, 2);
    CHECK(first.entries == std::vector<size_t>{0, 2});
    REQUIRE(first.next_token);
    Page second = page_of(keys, false, parse_page_token(*first.next_token), 2);
    CHECK(second.entries == std::vector<size_t>{3, 1});
    CHECK_FALSE(second.next_token);

    Page ascending = page_of(keys, true, std::nullopt, 3);
    CHECK(ascending.entries == std::vector<size_t>{1, 3, 2});
    REQUIRE(ascending.next_token);
    CHECK(page_of(keys, true, parse_page_token(*ascending.next_token), 3).entries == std::vector<size_t>{0});

    // An entry gone between pages does not shift the next page.
    const std::vector<PageKey> fewer{{30, "c"}, {10, "a"}, {20, "b1"}};
    CHECK(page_of(fewer, false, parse_page_token(*first.next_token), 2).entries == std::vector<size_t>{2, 1});
    // A page that ends exactly with the list has no next token.
    CHECK_FALSE(page_of(keys, false, std::nullopt, 4).next_token);
    CHECK(page_of({}, false, std::nullopt, 4).entries.empty());
}
