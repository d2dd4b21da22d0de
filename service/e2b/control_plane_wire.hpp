// E2B's control-plane wire (docs/e2b.md, "Control plane") as the SDK e2b 2.51.0 sends and reads
// it (the openapi types in its dist/index.d.ts, its calls in dist/index.mjs): the request
// bodies, checked field by field; the objects it reads back (Sandbox, SandboxDetail,
// ListedSandbox, SandboxMetric, SnapshotInfo); its times; the list's metadata filter and
// paging tokens. Only this file knows E2B's field names: control_plane.cpp maps them onto
// serve's sandboxes, so a new SDK version touches this file alone.
//
// Every function that reads a client's input throws RefusedRequest (bad_field) with a message
// naming the field at fault.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/agent_protocol.hpp"
#include "service/sandbox_settings.hpp"

namespace agentvm {

using WallTime = std::chrono::system_clock::time_point;

// The envd version serve's sandboxes report: the highest whose features the facade implements
// (docs/e2b.md: 0.5.7 adds octet-stream uploads; getMetrics needs 0.1.5, disk metrics 0.2.4).
inline constexpr std::string_view e2b_envd_version = "0.5.7";
// E2B's default sandbox lifetime, for a create or a resume that names none.
inline constexpr std::chrono::seconds e2b_default_timeout{300};
// The list and snapshot-list page size: E2B's documented default, and the most one page holds.
inline constexpr size_t e2b_default_page = 100;
inline constexpr size_t e2b_max_page = 1000;

// ---- requests

// POST /v2/sandboxes (NewSandboxV2). What agentvm cannot do is refused naming the field.
struct E2bCreate {
    std::string template_id;
    std::chrono::seconds timeout = e2b_default_timeout;
    std::map<std::string, std::string> env;
    Json metadata = Json::object();
    bool auto_pause = false;  // lifecycle.onTimeout "pause"
    // allow_internet_access and network (e2b_network.hpp); none: serve's default.
    std::optional<EgressRules> egress;
};
E2bCreate parse_e2b_create(const Json& body);

// POST /v2/sandboxes/{id}/connect (ConnectSandboxV2): `memory` false asks for a resume from disk
// alone, which agentvm does not do (refused when the sandbox is paused).
struct E2bConnect {
    std::optional<std::chrono::seconds> timeout;
    bool memory = true;
};
E2bConnect parse_e2b_connect(const Json& body);

// POST /sandboxes/{id}/timeout: {timeout} in seconds.
std::chrono::seconds parse_e2b_set_timeout(const Json& body);

// POST /sandboxes/{id}/fork (SandboxForkRequest).
struct E2bFork {
    unsigned count = 1;
    std::optional<std::chrono::seconds> timeout;
};
E2bFork parse_e2b_fork(const Json& body, unsigned max_count);

// POST /sandboxes/{id}/pause: {memory?}; memory false (a pause without memory) is refused.
void parse_e2b_pause(const Json& body);

// POST /sandboxes/{id}/snapshots (SandboxSnapshotRequest): the name, if one is given.
std::optional<std::string> parse_e2b_snapshot_request(const Json& body);

// ---- objects

// A sandbox as the facade shows it, running or paused, in E2B's terms.
struct E2bSandboxView {
    std::string id;
    std::string template_id;
    std::optional<std::string> alias;
    std::string envd_token;
    std::string traffic_token;
    bool paused = false;
    WallTime started_at;
    WallTime end_at;
    Json metadata = Json::object();
    unsigned cpu_count = 0;  // 0: not known (a pool whose VMs boot cold)
    uint64_t memory_mb = 0;
    uint64_t disk_mb = 0;
    bool pause_on_timeout = false;
    std::string domain;  // serve's --e2b-domain: getHost(port) is "<port>-<id>.<domain>"; none when empty
    std::optional<EgressRules> egress;  // the rules it was given; none: serve's default
};
// Sandbox: the answer of create, connect and each fork.
Json e2b_sandbox_json(const E2bSandboxView& view);
// SandboxDetail: getInfo's answer.
Json e2b_detail_json(const E2bSandboxView& view);
// ListedSandbox: one entry of the list.
Json e2b_listed_json(const E2bSandboxView& view);

// SandboxMetric: one reading of a sandbox's VM.
struct E2bMetric {
    WallTime at;
    double cpu_used_pct = 0;
    unsigned cpu_count = 0;
    uint64_t mem_used = 0;
    uint64_t mem_total = 0;
    uint64_t mem_cache = 0;
    uint64_t disk_used = 0;
    uint64_t disk_total = 0;
};
Json e2b_metric_json(const E2bMetric& metric);

// SnapshotInfo.
Json e2b_snapshot_json(const std::string& snapshot_id, const std::vector<std::string>& names);
// One failed entry of a fork's answer (SandboxForkResult.error): the SDK maps `code` as it
// maps an HTTP status.
Json e2b_fork_error_json(int status, const std::string& message);

// ---- times: ISO 8601 in UTC, with milliseconds ("2026-12-01T10:00:00.123Z")

std::string e2b_time(WallTime when);
// RFC 3339 as the SDK sends startedAfter (Date.toISOString), or with an offset; nullopt for
// anything else.
std::optional<WallTime> parse_e2b_time(std::string_view text);

// ---- the list's query

// %XX decoded (and '+' as a space, for form encoding); nullopt for a malformed escape.
std::optional<std::string> percent_decode(std::string_view text, bool plus_is_space);
// The metadata filter, as the query argument reads once the query's own encoding is undone:
// parsed as application/x-www-form-urlencoded, then each key and value percent-decoded once
// more (the SDK encodes each before it builds the form).
std::map<std::string, std::string> decode_metadata_filter(std::string_view argument);

// Where a page starts: after the entry with this key, in the list's order (entries ordered by
// time, then id). A token names it opaquely; one serve did not make is refused.
struct PageKey {
    int64_t time_ms = 0;
    std::string id;
    auto operator<=>(const PageKey&) const = default;
};
std::string page_token(const PageKey& key);
PageKey parse_page_token(std::string_view token);

// GET /v2/sandboxes's query; `argument` reads one query argument (decoded once).
using QueryArgument = std::function<std::optional<std::string>(const char* name)>;
struct E2bListQuery {
    std::map<std::string, std::string> metadata;
    bool running = true;
    bool paused = true;
    std::optional<std::string> template_id;
    std::optional<WallTime> started_after;
    bool ascending = false;  // E2B's default order: newest first
    size_t limit = e2b_default_page;
    std::optional<PageKey> after;
};
E2bListQuery parse_e2b_list_query(const QueryArgument& argument);

// GET /snapshots's query.
struct E2bSnapshotQuery {
    std::optional<std::string> sandbox_id;
    std::optional<std::string> name;
    size_t limit = e2b_default_page;
    std::optional<PageKey> after;
};
E2bSnapshotQuery parse_e2b_snapshot_query(const QueryArgument& argument);

// One page of `keys` (in any order): the indices of its entries, in the list's order, and the
// token of the next page when there is one.
struct Page {
    std::vector<size_t> entries;
    std::optional<std::string> next_token;
};
Page page_of(const std::vector<PageKey>& keys, bool ascending, const std::optional<PageKey>& after, size_t limit);

} // namespace agentvm
