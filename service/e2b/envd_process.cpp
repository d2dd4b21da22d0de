#include "service/e2b/envd_process.hpp"

#include <array>
#include <climits>
#include <utility>

#include <fmt/format.h>

#include "common/base64.hpp"

namespace agentvm {
namespace {

// Go's names of the Linux signals (syscall.Signal.String()), which envd's status shows.
constexpr std::array<std::string_view, 32> go_signal_names{
    "",
    "hangup",
    "interrupt",
    "quit",
    "illegal instruction",
    "trace/breakpoint trap",
    "aborted",
    "bus error",
    "floating point exception",
    "killed",
    "user defined signal 1",
    "segmentation fault",
    "user defined signal 2",
    "broken pipe",
    "alarm clock",
    "terminated",
    "stack fault",
    "child exited",
    "continued",
    "stopped (signal)",
    "stopped",
    "stopped (tty input)",
    "stopped (tty output)",
    "urgent I/O condition",
    "CPU time limit exceeded",
    "file size limit exceeded",
    "virtual timer expired",
    "profiling timer expired",
    "window changed",
    "I/O possible",
    "power failure",
    "bad system call",
};

constexpr std::array<std::pair<std::string_view, int>, 3> signal_values{{
    {"SIGNAL_UNSPECIFIED", 0},
    {"SIGNAL_SIGTERM", 15},
    {"SIGNAL_SIGKILL", 9},
}};

// The bytes of an agent event's data / data_b64; nullopt when it carries neither.
std::optional<std::string> event_bytes(const Json& event)
{
    if (const auto data = event.find("data"); data != event.end() && data->is_string())
        return data->get<std::string>();
    if (const auto data = event.find("data_b64"); data != event.end() && data->is_string())
        return base64_decode(data->get_ref<const std::string&>());
    return std::nullopt;
}

// What the history keeps of a command line: at most 64 arguments of at most 1 KiB.
Json clipped_argv(const Json& argv)
{
    Json out = Json::array();
    for (size_t i = 0; i < argv.size() && i < 64; ++i) {
        const std::string& arg = argv[i].get_ref<const std::string&>();
        out.push_back(arg.size() > 1024 ? arg.substr(0, 1024) + "…" : arg);
    }
    if (argv.size() > 64)
        out.push_back("…");
    return out;
}

Json summary_of(const Json& request)
{
    Json summary{{"op", json_field(request, "op")}};
    for (const char* key : {"pid", "tag"})
        if (request.contains(key))
            summary[key] = json_field(request, key);
    return summary;
}

// Streams an attach to `request`'s process: the start event when attached, its output, its end.
void follow_process(const std::shared_ptr<ConnectStream>& stream, Json request)
{
    ConnectStream* out = stream.get();
    Json summary = summary_of(request);
    auto on_event = [out](Json&& event) {
        if (event.value("event", "") == "attached") {
            const Json& pid = json_field(event, "pid");
            out->send(process_start_event(pid.is_number_integer() ? pid.get<int64_t>() : 0));
        } else if (std::optional<Json> data = process_data_event(event)) {
            out->send(*data);
        }
    };
    auto on_answer = [out](Json&& answer) {
        if (answer.contains("error"))
            return out->end(connect_error_of_agent(answer));
        if (answer.value("detached", false))
            return out->end(ConnectError{"canceled", "the stream was detached from its process"});
        out->send(process_end_event(answer));
        out->end();
    };
    stream->follow(std::move(request), std::move(summary), std::move(on_event), std::move(on_answer));
}

} // namespace

Json spawn_request(const Json& start_message, std::optional<std::chrono::milliseconds> timeout)
{
    const MessageReader start(start_message);
    const MessageReader process = start.message("process", "process");
    const std::string cmd = process.string("cmd", "cmd");
    if (cmd.empty())
        throw_invalid_argument("\"process.cmd\" is required: the command to run");
    Json argv = Json::array({cmd});
    for (std::string& arg : process.strings("args", "args"))
        argv.push_back(std::move(arg));
    Json request{{"op", "spawn"}, {"argv", std::move(argv)}};
    if (std::map<std::string, std::string> envs = process.string_map("envs", "envs"); !envs.empty())
        request["env"] = envs;
    if (std::string cwd = process.string("cwd", "cwd"); !cwd.empty())
        request["cwd"] = std::move(cwd);
    request["stdin"] = start.boolean("stdin", "stdin");
    if (start.has("pty", "pty")) {
        const MessageReader size = start.message("pty", "pty").message("size", "size");
        request["pty"] = Json{{"rows", size.uint32("rows", "rows")}, {"cols", size.uint32("cols", "cols")}};
    }
    if (std::string tag = start.string("tag", "tag"); !tag.empty())
        request["tag"] = std::move(tag);
    if (timeout && timeout->count() > 0)
        request["timeout"] = static_cast<double>(timeout->count()) / 1000.0;
    request["replay_bytes"] = start_replay_bytes;
    return request;
}

Json process_selector(const MessageReader& request)
{
    const MessageReader selector = request.message("process", "process");
    const bool by_pid = selector.has("pid", "pid");
    const bool by_tag = selector.has("tag", "tag");
    if (by_pid && by_tag)
        throw_invalid_argument("\"process\" names its process by pid or by tag, not both");
    if (by_pid) {
        const uint32_t pid = selector.uint32("pid", "pid");
        if (pid > INT_MAX)
            throw ConnectFailure("not_found", fmt::format("no process {}", pid));
        return Json{{"pid", pid}};
    }
    if (by_tag)
        return Json{{"tag", selector.string("tag", "tag")}};
    throw_invalid_argument("\"process\" must name a process: {\"pid\": N} or {\"tag\": T}");
}

std::string agent_signal(const MessageReader& request)
{
    switch (request.enum_value("signal", "signal", signal_values)) {
    case 9:
        return "KILL";
    case 15:
        return "TERM";
    default:
        throw_invalid_argument("\"signal\" is required: SIGNAL_SIGKILL or SIGNAL_SIGTERM");
    }
}

Json process_start_event(int64_t pid)
{
    return Json{{"event", Json{{"start", Json{{"pid", pid}}}}}};
}

std::optional<Json> process_data_event(const Json& agent_event)
{
    const std::string kind = agent_event.value("event", "");
    if (kind != "stdout" && kind != "stderr" && kind != "pty")
        return std::nullopt;
    const std::optional<std::string> bytes = event_bytes(agent_event);
    if (!bytes)
        return std::nullopt;
    return Json{{"event", Json{{"data", Json{{kind, proto_bytes(*bytes)}}}}}};
}

std::string exit_status_text(const Json& attach_answer)
{
    const Json& code = json_field(attach_answer, "exit_code");
    if (code.is_number_integer())
        return fmt::format("exit status {}", code.get<int64_t>());
    const Json& signal = json_field(attach_answer, "signal");
    if (signal.is_number_integer()) {
        const int64_t number = signal.get<int64_t>();
        if (number > 0 && number < static_cast<int64_t>(go_signal_names.size()))
            return fmt::format("signal: {}", go_signal_names[static_cast<size_t>(number)]);
        return fmt::format("signal: signal {}", number);
    }
    return "unknown";
}

Json process_end_event(const Json& attach_answer)
{
    const Json& code = json_field(attach_answer, "exit_code");
    const bool exited = code.is_number_integer();
    const int64_t exit_code = exited ? code.get<int64_t>() : -1;
    const std::string status = exit_status_text(attach_answer);
    Json end{{"exitCode", exit_code}, {"exited", exited}, {"status", status}};
    // envd's error is Go's error of the wait: set for any exit but a clean one, the same text.
    if (exit_code != 0)
        end["error"] = status;
    return Json{{"event", Json{{"end", std::move(end)}}}};
}

Json process_list_response(const Json& list_answer)
{
    Json processes = Json::array();
    const Json& listed = json_field(list_answer, "processes");
    if (!listed.is_array())
        return Json{{"processes", std::move(processes)}};
    for (const Json& process : listed) {
        if (!process.is_object())
            continue;
        const std::string kind = process.value("kind", "");
        if ((kind != "exec" && kind != "spawn") || !process.value("running", false))
            continue;
        const Json& argv = json_field(process, "argv");
        const Json& pid = json_field(process, "pid");
        if (!argv.is_array() || argv.empty() || !argv[0].is_string() || !pid.is_number_integer())
            continue;
        Json args = Json::array();
        for (size_t i = 1; i < argv.size(); ++i)
            if (argv[i].is_string())
                args.push_back(argv[i]);
        Json envs = Json::object();
        if (const Json& env = json_field(process, "env"); env.is_object())
            for (const auto& [key, value] : env.items())
                if (value.is_string())
                    envs[key] = value;
        Json config{{"cmd", argv[0]}, {"args", std::move(args)}, {"envs", std::move(envs)}};
        if (const Json& cwd = json_field(process, "cwd"); cwd.is_string())
            config["cwd"] = cwd;
        Json info{{"config", std::move(config)}, {"pid", pid}};
        if (const Json& tag = json_field(process, "tag"); tag.is_string())
            info["tag"] = tag;
        processes.push_back(std::move(info));
    }
    return Json{{"processes", std::move(processes)}};
}

void process_start(RpcCall& call, const std::shared_ptr<ConnectStream>& stream)
{
    Json request = agent_request(call, spawn_request(call.message, call.timeout));
    Json summary{{"op", "spawn"}, {"argv", clipped_argv(request["argv"])}};
    auto on_answer = [stream](Json&& answer) {
        if (answer.contains("error"))
            return stream->end(connect_error_of_agent(answer));
        // A client gone by now leaves its process running, as a background command's does.
        const Json& pid = json_field(answer, "pid");
        if (stream->ended() || stream->client_gone() || !pid.is_number_integer())
            return;
        follow_process(stream, Json{{"op", "attach"}, {"pid", pid}, {"replay", true}});
    };
    call.sandbox->call(std::move(request), std::move(summary),
                       answering(call.exchange, CallHandlers{[](Json&&) {}, std::move(on_answer)}));
}

void process_connect(RpcCall& call, const std::shared_ptr<ConnectStream>& stream)
{
    Json request = process_selector(MessageReader(call.message));
    request["op"] = "attach";
    // envd's Connect follows a process from the moment it connects.
    request["replay"] = false;
    follow_process(stream, std::move(request));
}

void process_list(RpcCall& call)
{
    relay_unary(call, Json{{"op", "list_processes"}}, [](const Json& answer) { return process_list_response(answer); });
}

void process_send_input(RpcCall& call)
{
    const MessageReader message(call.message);
    Json request = process_selector(message);
    const MessageReader input = message.message("input", "input");
    const bool has_stdin = input.has("stdin", "stdin");
    const bool has_pty = input.has("pty", "pty");
    if (has_stdin == has_pty)
        throw_invalid_argument("\"input\" carries one of \"stdin\" and \"pty\"");
    request["op"] = "send_stdin";
    request["data_b64"] = proto_bytes(has_stdin ? input.bytes("stdin", "stdin") : input.bytes("pty", "pty"));
    relay_unary(call, std::move(request), [](const Json&) { return Json::object(); });
}

void process_close_stdin(RpcCall& call)
{
    Json request = process_selector(MessageReader(call.message));
    request["op"] = "close_stdin";
    relay_unary(call, std::move(request), [](const Json&) { return Json::object(); });
}

void process_send_signal(RpcCall& call)
{
    const MessageReader message(call.message);
    Json request = process_selector(message);
    request["op"] = "signal";
    request["signal"] = agent_signal(message);
    // envd signals the command's process group: a shell's children go with it.
    request["group"] = true;
    relay_unary(call, std::move(request), [](const Json&) { return Json::object(); });
}

void process_update(RpcCall& call)
{
    const MessageReader message(call.message);
    Json request = process_selector(message);
    if (!message.has("pty", "pty"))
        return answer_unary(*call.exchange, Json::object());
    const MessageReader size = message.message("pty", "pty").message("size", "size");
    request["op"] = "resize";
    request["rows"] = size.uint32("rows", "rows");
    request["cols"] = size.uint32("cols", "cols");
    relay_unary(call, std::move(request), [](const Json&) { return Json::object(); });
}

} // namespace agentvm
