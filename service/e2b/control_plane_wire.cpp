#include "service/e2b/control_plane_wire.hpp"

#include <time.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "common/base64.hpp"
#include "common/whole_number.hpp"
#include "protocol/env_limits.hpp"
#include "service/create_request.hpp"
#include "service/e2b/e2b_network.hpp"
#include "service/problem.hpp"

namespace agentvm {
namespace {

constexpr size_t max_template_id = 256;
constexpr size_t max_snapshot_name = 128;
constexpr std::string_view token_prefix = "agentvm-page:v1:";

// What a request may carry, with what each does not do: a field outside it is refused naming
// the ones it may carry.
void refuse_unknown(const Json& body, std::initializer_list<std::string_view> known, std::string_view what)
{
    for (const auto& [key, value] : body.items())
        if (std::find(known.begin(), known.end(), key) == known.end())
            throw_bad_field(fmt::format("{}: unknown field \"{:.64}\" (it takes {})", what, key, fmt::join(known, ", ")));
}

// E2B's timeouts are int32 seconds; serve's longest sandbox lives max_sandbox_timeout_s.
std::chrono::seconds seconds_field(const Json& value, std::string_view name)
{
    if (!value.is_number_integer() || value.get<int64_t>() < 1 || value.get<int64_t>() > max_sandbox_timeout_s)
        throw_bad_field(fmt::format("\"{}\" must be a whole number of seconds from 1 to {}", name, max_sandbox_timeout_s));
    return std::chrono::seconds(value.get<int64_t>());
}

bool bool_field(const Json& value, std::string_view name)
{
    if (!value.is_boolean())
        throw_bad_field(fmt::format("\"{}\" must be true or false", name));
    return value.get<bool>();
}

const Json& object_body(const Json& body, std::string_view what)
{
    if (!body.is_object())
        throw RefusedRequest(ServiceError::bad_json, fmt::format("{}: the body must be a JSON object", what));
    return body;
}

[[noreturn]] void not_done(std::string_view field, std::string_view why)
{
    throw_bad_field(fmt::format("\"{}\": agentvm does not do {}; leave it out", field, why));
}

// At most 18 digits, so every value fits an int64_t.
std::optional<int64_t> short_number(std::string_view text, size_t max_digits)
{
    if (text.size() > max_digits)
        return std::nullopt;
    const std::optional<uint64_t> value = whole_number<uint64_t>(text);
    if (!value)
        return std::nullopt;
    return static_cast<int64_t>(*value);
}

size_t limit_argument(const QueryArgument& argument)
{
    const std::optional<std::string> text = argument("limit");
    if (!text)
        return e2b_default_page;
    const std::optional<int64_t> limit = short_number(*text, 9);
    if (!limit || *limit < 1 || *limit > static_cast<int64_t>(e2b_max_page))
        throw_bad_field(fmt::format("\"limit\" must be a whole number from 1 to {}", e2b_max_page));
    return static_cast<size_t>(*limit);
}

std::optional<PageKey> token_argument(const QueryArgument& argument)
{
    const std::optional<std::string> token = argument("nextToken");
    if (!token || token->empty())
        return std::nullopt;
    return parse_page_token(*token);
}

Json common_fields(const E2bSandboxView& view)
{
    Json out{{"sandboxID", view.id}, {"templateID", view.template_id}, {"clientID", "agentvm"},
             {"envdVersion", e2b_envd_version}};
    if (view.alias)
        out["alias"] = *view.alias;
    return out;
}

void add_state(Json& out, const E2bSandboxView& view)
{
    out["cpuCount"] = view.cpu_count;
    out["memoryMB"] = view.memory_mb;
    out["diskSizeMB"] = view.disk_mb;
    out["metadata"] = view.metadata;
    out["startedAt"] = e2b_time(view.started_at);
    out["endAt"] = e2b_time(view.end_at);
    out["state"] = view.paused ? "paused" : "running";
}

} // namespace

E2bCreate parse_e2b_create(const Json& body)
{
    object_body(body, "create");
    E2bCreate create;
    E2bNetworkFields network;
    bool pause_memory = true;
    for (const auto& [key, value] : body.items()) {
        if (key == "templateID") {
            if (!value.is_string() || value.get_ref<const std::string&>().empty()
                || value.get_ref<const std::string&>().size() > max_template_id)
                throw_bad_field(fmt::format("\"templateID\" must be a string of 1 to {} bytes", max_template_id));
            create.template_id = value.get<std::string>();
        } else if (key == "timeout") {
            create.timeout = seconds_field(value, "timeout");
        } else if (key == "metadata") {
            if (!value.is_object() || value.size() > max_metadata_entries)
                throw_bad_field(fmt::format("\"metadata\" must be an object of at most {} strings", max_metadata_entries));
            for (const auto& [name, text] : value.items())
                if (!text.is_string() || name.size() > 256 || text.get_ref<const std::string&>().size() > 4096)
                    throw_bad_field(fmt::format(
                        "\"metadata\": \"{:.64}\" must be a string of at most 4096 bytes, its name at most 256", name));
            create.metadata = value;
        } else if (key == "envVars") {
            if (!value.is_object() || value.size() > max_env_entries)
                throw_bad_field(fmt::format("\"envVars\" must be an object of at most {} strings", max_env_entries));
            for (const auto& [name, text] : value.items()) {
                if (!is_env_name(name))
                    throw_bad_field(fmt::format(
                        "\"envVars\": \"{:.64}\" is not a variable name (letters, digits, _; not a digit first)", name));
                if (!text.is_string() || text.get_ref<const std::string&>().find('\0') != std::string::npos)
                    throw_bad_field(fmt::format("\"envVars\": \"{}\" must be a string without NUL", name));
                create.env[name] = text.get<std::string>();
            }
        } else if (key == "autoPause") {
            create.auto_pause = bool_field(value, "autoPause");
        } else if (key == "autoPauseMemory") {
            pause_memory = bool_field(value, "autoPauseMemory");
        } else if (key == "autoResume") {
            if (!value.is_object() || !value.contains("enabled") || value.size() != 1)
                throw_bad_field("\"autoResume\" must be {\"enabled\": true or false}");
            if (bool_field(value["enabled"], "autoResume.enabled"))
                not_done("autoResume", "resume a paused sandbox on its traffic (resume it with Sandbox.connect)");
        } else if (key == "allow_internet_access") {
            network.allow_internet_access = bool_field(value, "allow_internet_access");
        } else if (key == "network") {
            network.network = &value;
        } else if (key == "iam") {
            not_done("iam", "workload identity tokens");
        } else if (key == "mcp") {
            not_done("mcp", "MCP gateways");
        } else if (key == "volumeMounts") {
            not_done("volumeMounts", "volumes");
        } else {
            throw_bad_field(fmt::format("create: unknown field \"{:.64}\" (it takes templateID, timeout, metadata, "
                                        "envVars, autoPause, autoPauseMemory, autoResume, allow_internet_access, network)",
                                        key));
        }
    }
    if (create.template_id.empty())
        throw RefusedRequest(ServiceError::missing_field, "\"templateID\" is required");
    if (!pause_memory)
        not_done("autoPauseMemory", "a pause without memory: its pauses keep the whole VM (leave it out, or true)");
    create.egress = e2b_egress_rules(network);
    return create;
}

E2bConnect parse_e2b_connect(const Json& body)
{
    object_body(body, "connect");
    refuse_unknown(body, {"timeout", "memory"}, "connect");
    E2bConnect connect;
    if (body.contains("timeout"))
        connect.timeout = seconds_field(body["timeout"], "timeout");
    if (body.contains("memory"))
        connect.memory = bool_field(body["memory"], "memory");
    return connect;
}

std::chrono::seconds parse_e2b_set_timeout(const Json& body)
{
    object_body(body, "timeout");
    refuse_unknown(body, {"timeout"}, "timeout");
    if (!body.contains("timeout"))
        throw RefusedRequest(ServiceError::missing_field, "\"timeout\" is required");
    return seconds_field(body["timeout"], "timeout");
}

E2bFork parse_e2b_fork(const Json& body, unsigned max_count)
{
    object_body(body, "fork");
    refuse_unknown(body, {"count", "timeout"}, "fork");
    E2bFork fork;
    if (body.contains("count")) {
        const Json& count = body["count"];
        if (!count.is_number_integer() || count.get<int64_t>() < 1 || count.get<int64_t>() > max_count)
            throw_bad_field(fmt::format("\"count\" must be a whole number from 1 to {}", max_count));
        fork.count = count.get<unsigned>();
    }
    if (body.contains("timeout"))
        fork.timeout = seconds_field(body["timeout"], "timeout");
    return fork;
}

void parse_e2b_pause(const Json& body)
{
    object_body(body, "pause");
    refuse_unknown(body, {"memory"}, "pause");
    if (body.contains("memory") && !bool_field(body["memory"], "memory"))
        not_done("memory", "a pause without memory: its pauses keep the whole VM (leave it out, or true)");
}

std::optional<std::string> parse_e2b_snapshot_request(const Json& body)
{
    object_body(body, "snapshot");
    refuse_unknown(body, {"name"}, "snapshot");
    if (!body.contains("name"))
        return std::nullopt;
    const Json& name = body["name"];
    const auto printable = [](char c) { return c > ' ' && c < 0x7f; };
    if (!name.is_string() || name.get_ref<const std::string&>().empty()
        || name.get_ref<const std::string&>().size() > max_snapshot_name
        || !std::all_of(name.get_ref<const std::string&>().begin(), name.get_ref<const std::string&>().end(),
                        printable))
        throw_bad_field(fmt::format("\"name\" must be 1 to {} printable ASCII characters, no spaces", max_snapshot_name));
    return name.get<std::string>();
}

Json e2b_sandbox_json(const E2bSandboxView& view)
{
    Json out = common_fields(view);
    out["envdAccessToken"] = view.envd_token;
    out["trafficAccessToken"] = view.traffic_token;
    out["domain"] = view.domain.empty() ? Json(nullptr) : Json(view.domain);
    return out;
}

Json e2b_detail_json(const E2bSandboxView& view)
{
    Json out = common_fields(view);
    add_state(out, view);
    out["envdAccessToken"] = view.envd_token;
    out["domain"] = view.domain.empty() ? Json(nullptr) : Json(view.domain);
    out["allowInternetAccess"] = e2b_internet_allowed(view.egress);
    if (view.egress)
        out["network"] = e2b_network_json(*view.egress);
    out["lifecycle"] = Json{{"onTimeout", view.pause_on_timeout ? "pause" : "kill"}, {"autoResume", false}};
    return out;
}

Json e2b_listed_json(const E2bSandboxView& view)
{
    Json out = common_fields(view);
    add_state(out, view);
    return out;
}

Json e2b_metric_json(const E2bMetric& metric)
{
    return Json{{"timestamp", e2b_time(metric.at)},
                {"timestampUnix", std::chrono::duration_cast<std::chrono::seconds>(metric.at.time_since_epoch()).count()},
                {"cpuUsedPct", std::round(metric.cpu_used_pct * 100) / 100},
                {"cpuCount", metric.cpu_count},
                {"memUsed", metric.mem_used},
                {"memTotal", metric.mem_total},
                {"memCache", metric.mem_cache},
                {"diskUsed", metric.disk_used},
                {"diskTotal", metric.disk_total}};
}

Json e2b_snapshot_json(const std::string& snapshot_id, const std::vector<std::string>& names)
{
    return Json{{"snapshotID", snapshot_id}, {"names", names}};
}

Json e2b_fork_error_json(int status, const std::string& message)
{
    return Json{{"error", Json{{"code", status}, {"message", message}}}};
}

std::string e2b_time(WallTime when)
{
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(when.time_since_epoch()).count();
    const time_t seconds = static_cast<time_t>(ms >= 0 ? ms / 1000 : (ms - 999) / 1000);
    struct tm utc {};
    ::gmtime_r(&seconds, &utc);
    return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday,
                       utc.tm_hour, utc.tm_min, utc.tm_sec, ms - static_cast<int64_t>(seconds) * 1000);
}

std::optional<WallTime> parse_e2b_time(std::string_view text)
{
    // YYYY-MM-DDTHH:MM:SS[.fraction](Z|+HH:MM|-HH:MM)
    if (text.size() < 20 || text.size() > 40)
        return std::nullopt;
    const auto digits = [&](size_t at, size_t count) -> std::optional<int> {
        const std::optional<int64_t> value = short_number(text.substr(at, count), count);
        return value && text.substr(at, count).find_first_not_of("0123456789") == std::string_view::npos
                   ? std::optional<int>(static_cast<int>(*value))
                   : std::nullopt;
    };
    const auto year = digits(0, 4), month = digits(5, 2), day = digits(8, 2), hour = digits(11, 2),
               minute = digits(14, 2), second = digits(17, 2);
    if (!year || !month || !day || !hour || !minute || !second || text[4] != '-' || text[7] != '-'
        || (text[10] != 'T' && text[10] != 't') || text[13] != ':' || text[16] != ':' || *month < 1 || *month > 12
        || *day < 1 || *day > 31 || *hour > 23 || *minute > 59 || *second > 60)
        return std::nullopt;
    size_t at = 19;
    int64_t ms = 0;
    if (text[at] == '.') {
        const size_t start = ++at;
        while (at < text.size() && text[at] >= '0' && text[at] <= '9')
            ++at;
        if (at == start || at - start > 9)
            return std::nullopt;
        std::string fraction(text.substr(start, at - start));
        fraction.resize(3, '0');
        ms = *short_number(fraction, 3);
    }
    int64_t offset_s = 0;
    const std::string_view zone = text.substr(at);
    if (zone != "Z" && zone != "z") {
        const auto zh = zone.size() == 6 ? short_number(zone.substr(1, 2), 2) : std::nullopt;
        const auto zm = zone.size() == 6 ? short_number(zone.substr(4, 2), 2) : std::nullopt;
        if (!zh || !zm || (zone[0] != '+' && zone[0] != '-') || zone[3] != ':' || *zh > 23 || *zm > 59)
            return std::nullopt;
        offset_s = (*zh * 3600 + *zm * 60) * (zone[0] == '+' ? 1 : -1);
    }
    struct tm utc {};
    utc.tm_year = *year - 1900;
    utc.tm_mon = *month - 1;
    utc.tm_mday = *day;
    utc.tm_hour = *hour;
    utc.tm_min = *minute;
    utc.tm_sec = *second;
    const time_t seconds = ::timegm(&utc);
    return WallTime(std::chrono::seconds(seconds - offset_s)) + std::chrono::milliseconds(ms);
}

std::optional<std::string> percent_decode(std::string_view text, bool plus_is_space)
{
    std::string out;
    out.reserve(text.size());
    const auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9')
            return c - '0';
        if (c >= 'a' && c <= 'f')
            return c - 'a' + 10;
        if (c >= 'A' && c <= 'F')
            return c - 'A' + 10;
        return -1;
    };
    for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '%') {
            if (i + 2 >= text.size())
                return std::nullopt;
            const int high = hex(text[i + 1]), low = hex(text[i + 2]);
            if (high < 0 || low < 0)
                return std::nullopt;
            out += static_cast<char>(high * 16 + low);
            i += 2;
        } else if (text[i] == '+' && plus_is_space) {
            out += ' ';
        } else {
            out += text[i];
        }
    }
    return out;
}

std::map<std::string, std::string> decode_metadata_filter(std::string_view argument)
{
    std::map<std::string, std::string> filter;
    size_t start = 0;
    while (start <= argument.size()) {
        const size_t end = std::min(argument.find('&', start), argument.size());
        const std::string_view pair = argument.substr(start, end - start);
        start = end + 1;
        if (pair.empty())
            continue;
        if (filter.size() >= max_metadata_entries)
            throw_bad_field(fmt::format("\"metadata\" filters on at most {} keys", max_metadata_entries));
        const size_t equals = pair.find('=');
        const std::string_view key = pair.substr(0, equals);
        const std::string_view value = equals == std::string_view::npos ? std::string_view() : pair.substr(equals + 1);
        // The form's own encoding, then the SDK's encoding of each key and value.
        const auto form_key = percent_decode(key, true), form_value = percent_decode(value, true);
        const auto decoded_key = form_key ? percent_decode(*form_key, false) : std::nullopt;
        const auto decoded_value = form_value ? percent_decode(*form_value, false) : std::nullopt;
        if (!decoded_key || !decoded_value || decoded_key->empty())
            throw_bad_field("\"metadata\" must be key=value pairs joined by &, each key and value percent-encoded");
        filter[*decoded_key] = *decoded_value;
    }
    return filter;
}

std::string page_token(const PageKey& key)
{
    return base64_encode(fmt::format("{}{}:{}", token_prefix, key.time_ms, key.id));
}

PageKey parse_page_token(std::string_view token)
{
    const auto refuse = [] { throw_bad_field("\"nextToken\" is not a token this serve gave (X-Next-Token)"); };
    const std::optional<std::string> text = token.size() <= 512 ? base64_decode(token) : std::nullopt;
    if (!text || !text->starts_with(token_prefix))
        refuse();
    const std::string_view rest = std::string_view(*text).substr(token_prefix.size());
    const size_t colon = rest.find(':');
    const std::optional<int64_t> time_ms =
        colon == std::string_view::npos ? std::nullopt : short_number(rest.substr(0, colon), 18);
    if (!time_ms || colon + 1 >= rest.size())
        refuse();
    return PageKey{*time_ms, std::string(rest.substr(colon + 1))};
}

E2bListQuery parse_e2b_list_query(const QueryArgument& argument)
{
    E2bListQuery query;
    if (const auto metadata = argument("metadata"))
        query.metadata = decode_metadata_filter(*metadata);
    if (const auto state = argument("state"); state && !state->empty()) {
        query.running = query.paused = false;
        size_t start = 0;
        while (start <= state->size()) {
            const size_t end = std::min(state->find(',', start), state->size());
            const std::string one = state->substr(start, end - start);
            start = end + 1;
            if (one == "running")
                query.running = true;
            else if (one == "paused")
                query.paused = true;
            else
                throw_bad_field(fmt::format("\"state\": \"{:.64}\" is not a state (running, paused)", one));
        }
    }
    if (const auto tpl = argument("template"); tpl && !tpl->empty())
        query.template_id = *tpl;
    if (const auto after = argument("startedAfter"); after && !after->empty()) {
        query.started_after = parse_e2b_time(*after);
        if (!query.started_after)
            throw_bad_field("\"startedAfter\" must be an ISO 8601 date-time (2026-12-01T10:00:00.000Z)");
    }
    if (const auto order = argument("order"); order && !order->empty()) {
        if (*order != "asc" && *order != "desc")
            throw_bad_field("\"order\" must be asc or desc");
        query.ascending = *order == "asc";
    }
    query.limit = limit_argument(argument);
    query.after = token_argument(argument);
    return query;
}

E2bSnapshotQuery parse_e2b_snapshot_query(const QueryArgument& argument)
{
    E2bSnapshotQuery query;
    if (const auto id = argument("sandboxID"); id && !id->empty())
        query.sandbox_id = *id;
    if (const auto name = argument("name"); name && !name->empty())
        query.name = *name;
    query.limit = limit_argument(argument);
    query.after = token_argument(argument);
    return query;
}

Page page_of(const std::vector<PageKey>& keys, bool ascending, const std::optional<PageKey>& after, size_t limit)
{
    std::vector<size_t> order(keys.size());
    for (size_t i = 0; i < order.size(); ++i)
        order[i] = i;
    const auto before = [&](size_t a, size_t b) { return ascending ? keys[a] < keys[b] : keys[b] < keys[a]; };
    std::sort(order.begin(), order.end(), before);
    Page page;
    for (size_t index : order) {
        if (after && !(ascending ? *after < keys[index] : keys[index] < *after))
            continue;
        if (page.entries.size() == limit) {
            page.next_token = page_token(keys[page.entries.back()]);
            break;
        }
        page.entries.push_back(index);
    }
    return page;
}

} // namespace agentvm
