#include "service/e2b/envd_filesystem.hpp"

#include <array>
#include <cmath>
#include <ctime>

#include <fmt/format.h>

#include "protocol/file_requests.hpp"

namespace agentvm {
namespace {

// list_dir's bounds (docs/protocol.md): envd lists whatever depth is asked, the agent down to
// max_list_depth levels and max_list_entries entries; a deeper ask lists what the agent
// does, a longer answer is refused rather than cut short without a word.

constexpr std::array<std::pair<std::string_view, std::string_view>, 3> entry_types{{
    {"file", "FILE_TYPE_FILE"},
    {"dir", "FILE_TYPE_DIRECTORY"},
    {"symlink", "FILE_TYPE_SYMLINK"},
}};

constexpr std::array<std::pair<std::string_view, std::string_view>, 4> event_types{{
    {"create", "EVENT_TYPE_CREATE"},
    {"write", "EVENT_TYPE_WRITE"},
    {"remove", "EVENT_TYPE_REMOVE"},
    {"chmod", "EVENT_TYPE_CHMOD"},
}};

// "0644" -> 0644; nullopt for anything but 1 to 6 octal digits.
std::optional<uint32_t> octal_mode(const Json& mode)
{
    if (!mode.is_string())
        return std::nullopt;
    const std::string& text = mode.get_ref<const std::string&>();
    if (text.empty() || text.size() > 6 || text.find_first_not_of("01234567") != std::string::npos)
        return std::nullopt;
    return static_cast<uint32_t>(std::stoul(text, nullptr, 8));
}

std::string last_component(const std::string& name)
{
    const size_t slash = name.find_last_of('/');
    if (slash == std::string::npos || name == "/")
        return name;
    return name.substr(slash + 1);
}

void require_entry_path(const std::string& path, const char* field)
{
    if (path.empty())
        throw_invalid_argument(fmt::format("\"{}\" is required", field));
}

Json entry_response(const Json& agent_entry)
{
    std::optional<Json> entry = entry_info(agent_entry);
    if (!entry)
        throw ConnectFailure("internal", "the entry's name is not UTF-8, which a protobuf string cannot carry");
    return Json{{"entry", std::move(*entry)}};
}

} // namespace

std::string go_permissions(uint32_t mode_bits, const std::string& type)
{
    std::string out;
    // Go's order of the type and special letters: "dalTLDpSugct?" (a, l, T and ? never occur
    // here).
    if (type == "dir")
        out += 'd';
    if (type == "symlink")
        out += 'L';
    if (type == "char" || type == "block")
        out += 'D';
    if (type == "fifo")
        out += 'p';
    if (type == "socket")
        out += 'S';
    if (mode_bits & 04000)
        out += 'u';
    if (mode_bits & 02000)
        out += 'g';
    if (type == "char")
        out += 'c';
    if (mode_bits & 01000)
        out += 't';
    if (out.empty())
        out += '-';
    static constexpr std::string_view rwx = "rwxrwxrwx";
    for (size_t i = 0; i < rwx.size(); ++i)
        out += (mode_bits & (1u << (8 - i))) ? rwx[i] : '-';
    return out;
}

std::string rfc3339_time(double seconds)
{
    if (!std::isfinite(seconds))
        seconds = 0;
    auto whole = static_cast<int64_t>(std::floor(seconds));
    auto micros = static_cast<int64_t>(std::llround((seconds - std::floor(seconds)) * 1e6));
    if (micros >= 1000000) {
        whole += 1;
        micros -= 1000000;
    }
    const auto time = static_cast<time_t>(whole);
    std::tm utc{};
    if (!gmtime_r(&time, &utc))
        utc = std::tm{};
    std::string text = fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}", utc.tm_year + 1900, utc.tm_mon + 1,
                                   utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec);
    // protobuf writes 0, 3, 6 or 9 fractional digits.
    if (micros % 1000 == 0 && micros != 0)
        text += fmt::format(".{:03}", micros / 1000);
    else if (micros != 0)
        text += fmt::format(".{:06}", micros);
    return text + "Z";
}

std::optional<Json> entry_info(const Json& agent_entry)
{
    const Json& name = json_field(agent_entry, "name");
    const Json& path = json_field(agent_entry, "path");
    if (!name.is_string() || !path.is_string())
        return std::nullopt;
    // list_dir names deeper entries by their path under the listed directory; envd by their
    // own name.
    Json entry{{"name", last_component(name.get<std::string>())}, {"path", path}};
    const Json& type_field = json_field(agent_entry, "type");
    const std::string type = type_field.is_string() ? type_field.get<std::string>() : "";
    for (const auto& [agent, proto] : entry_types)
        if (agent == type)
            entry["type"] = proto;
    if (const Json& size = json_field(agent_entry, "size"); size.is_number_integer())
        entry["size"] = std::to_string(size.get<int64_t>());  // int64, a string as protobuf writes it
    const uint32_t mode = octal_mode(json_field(agent_entry, "mode")).value_or(0);
    entry["mode"] = mode & 0777;
    entry["permissions"] = go_permissions(mode, type);
    for (const char* key : {"owner", "group"})
        if (const Json& value = json_field(agent_entry, key); value.is_string())
            entry[key] = value;
    if (const Json& mtime = json_field(agent_entry, "mtime"); mtime.is_number())
        entry["modifiedTime"] = rfc3339_time(mtime.get<double>());
    if (const Json& target = json_field(agent_entry, "symlink_target"); target.is_string())
        entry["symlinkTarget"] = target;
    return entry;
}

std::optional<Json> watch_event(const Json& agent_event)
{
    const Json& kind = json_field(agent_event, "event");
    if (kind == "watching")
        return Json{{"start", Json::object()}};
    if (kind != "fs")
        return std::nullopt;
    const Json& name = json_field(agent_event, "name");
    const Json& type = json_field(agent_event, "type");
    if (!name.is_string() || !type.is_string())
        return std::nullopt;
    for (const auto& [agent, proto] : event_types)
        if (agent == type.get_ref<const std::string&>())
            return Json{{"filesystem", Json{{"name", name}, {"type", proto}}}};
    return std::nullopt;
}

void filesystem_stat(RpcCall& call)
{
    const std::string path = MessageReader(call.message).string("path", "path");
    require_entry_path(path, "path");
    relay_unary(call, Json{{"op", "stat"}, {"path", path}}, entry_response);
}

void filesystem_make_dir(RpcCall& call)
{
    const std::string path = MessageReader(call.message).string("path", "path");
    require_entry_path(path, "path");
    auto exchange = call.exchange;
    auto sandbox = call.sandbox;
    Json stat = agent_request(call, Json{{"op", "stat"}, {"path", path}});
    auto on_made = [exchange, sandbox, path, stat = std::move(stat)](Json&& answer) mutable {
        if (answer.contains("error"))
            return answer_unary_error(*exchange, connect_error_of_agent(answer));
        if (!answer.value("created", false))
            return answer_unary_error(*exchange, ConnectError{"already_exists",
                                                              fmt::format("directory {} already exists", path)});
        // The entry of the directory made; envd answers it, though the SDK reads none.
        auto on_stat = [exchange](Json&& entry) {
            if (entry.contains("error"))
                return answer_unary(*exchange, Json::object());
            std::optional<Json> info = entry_info(entry);
            answer_unary(*exchange, info ? Json{{"entry", std::move(*info)}} : Json::object());
        };
        sandbox->call(std::move(stat), std::nullopt,
                      answering(exchange, CallHandlers{[](Json&&) {}, std::move(on_stat)}));
    };
    call.sandbox->call(agent_request(call, Json{{"op", "make_dir"}, {"path", path}}), Json{{"op", "make_dir"}},
                       answering(exchange, CallHandlers{[](Json&&) {}, std::move(on_made)}));
}

void filesystem_move(RpcCall& call)
{
    const MessageReader message(call.message);
    const std::string source = message.string("source", "source");
    const std::string destination = message.string("destination", "destination");
    require_entry_path(source, "source");
    require_entry_path(destination, "destination");
    relay_unary(call, Json{{"op", "move"}, {"from", source}, {"to", destination}},
                [](const Json& answer) { return entry_response(json_field(answer, "entry")); });
}

void filesystem_list_dir(RpcCall& call)
{
    const MessageReader message(call.message);
    const std::string path = message.string("path", "path");
    require_entry_path(path, "path");
    uint32_t depth = message.uint32("depth", "depth");
    if (depth == 0)
        depth = 1;
    Json request{{"op", "list_dir"}, {"path", path}, {"depth", std::min(depth, max_list_depth)},
                 {"max_entries", max_list_entries}};
    relay_unary(call, std::move(request), [path](const Json& answer) {
        if (json_field(answer, "truncated") == true)
            throw ConnectFailure("resource_exhausted",
                                 fmt::format("{} holds more than {} entries at that depth: list less deep, or "
                                             "a subdirectory",
                                             path, max_list_entries));
        Json entries = Json::array();
        if (const Json& listed = json_field(answer, "entries"); listed.is_array())
            for (const Json& agent_entry : listed)
                if (std::optional<Json> entry = entry_info(agent_entry))
                    entries.push_back(std::move(*entry));
        return Json{{"entries", std::move(entries)}};
    });
}

void filesystem_remove(RpcCall& call)
{
    const std::string path = MessageReader(call.message).string("path", "path");
    require_entry_path(path, "path");
    relay_unary(call, Json{{"op", "remove"}, {"path", path}, {"recursive", true}},
                [](const Json&) { return Json::object(); });
}

void filesystem_watch_dir(RpcCall& call, const std::shared_ptr<ConnectStream>& stream)
{
    const MessageReader message(call.message);
    const std::string path = message.string("path", "path");
    require_entry_path(path, "path");
    Json request = agent_request(call, Json{{"op", "watch"}, {"path", path}, {"recursive", message.boolean("recursive", "recursive")}});
    ConnectStream* out = stream.get();
    auto on_event = [out](Json&& event) {
        if (json_field(event, "event") == "overflow")
            return out->end(ConnectError{"data_loss",
                                         "the watch lost events (the guest's inotify queue overflowed, or the tree "
                                         "grew past 8192 directories): list the directory again and watch anew"});
        if (std::optional<Json> response = watch_event(event))
            out->send(*response);
    };
    auto on_answer = [out](Json&& answer) {
        if (answer.contains("error"))
            return out->end(connect_error_of_agent(answer));
        out->end();
    };
    stream->follow(std::move(request), Json{{"op", "watch"}, {"path", path}}, std::move(on_event),
                   std::move(on_answer));
}

} // namespace agentvm
