#include "protocol/agent_protocol.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "protocol/utf8.hpp"
#include "protocol/cmdline.hpp"
#include "protocol/request_fields.hpp"
#include "common/base64.hpp"

namespace agentvm {

namespace {

ShellRequest parse_shell(const Json& object)
{
    ShellRequest shell;
    shell.cmd = require_string(object, "cmd");
    // The line travels to bash as text; a NUL would cut it short.
    if (shell.cmd.find('\0') != std::string::npos)
        bad_field("cmd", "must not contain NUL");
    if (object.contains("stdin") || object.contains("stdin_b64"))
        bad_field("stdin", "is not supported by shell (commands read /dev/null); use exec");
    shell.timeout_s = optional_timeout(object);
    shell.max_output = optional_max_output(object);
    parse_stream(object, shell);
    return shell;
}

RunCodeRequest parse_run_code(const Json& object)
{
    RunCodeRequest run;
    run.code = require_string(object, "code");
    // The cell travels to the interpreter inside a JSON line, or to bash as text: neither
    // Python source nor a bash line has a NUL.
    if (run.code.find('\0') != std::string::npos)
        bad_field("code", "must not contain NUL");
    run.language = optional_language(object);
    run.context = optional_context(object);
    run.env = parse_env(object);
    run.timeout_s = optional_timeout(object);
    run.max_output = optional_max_output(object);
    parse_stream(object, run);
    return run;
}

ListDirRequest parse_list_dir(const Json& object)
{
    ListDirRequest list;
    list.path = require_string(object, "path");
    if (auto max = object.find("max_entries"); max != object.end() && !max->is_null()) {
        if (!max->is_number_unsigned() || max->get<uint64_t>() == 0 || max->get<uint64_t>() > max_list_entries)
            bad_field("max_entries", "must be an integer from 1 to " + std::to_string(max_list_entries));
        list.max_entries = max->get<uint32_t>();
    }
    list.depth = parse_list_depth(object);
    list.user = parse_user(object);
    return list;
}

CancelRequest parse_cancel(const Json& object)
{
    const Json& call = require(object, "call");
    if (!call.is_string() && !call.is_number())
        bad_field("call", "must be the id (a string or a number) of a running call");
    return CancelRequest{call};
}

ExecRequest parse_exec(const Json& object)
{
    ExecRequest exec;
    exec.argv = parse_argv(object);
    exec.env = parse_env(object);
    exec.cwd = optional_string(object, "cwd");
    exec.tag = parse_tag(object);
    exec.user = parse_user(object);
    exec.stdin_data = get_bytes(object, "stdin");
    exec.timeout_s = optional_timeout(object);
    exec.max_output = optional_max_output(object);
    parse_stream(object, exec);
    return exec;
}

SpawnRequest parse_spawn(const Json& object)
{
    SpawnRequest spawn;
    spawn.command.argv = parse_argv(object);
    spawn.command.env = parse_env(object);
    spawn.command.cwd = optional_string(object, "cwd");
    spawn.command.tag = parse_tag(object);
    spawn.command.user = parse_user(object);
    spawn.command.timeout_s = optional_timeout(object);
    spawn.settings = parse_spawn_settings(object);
    return spawn;
}

WriteFileRequest parse_write_file(const Json& object)
{
    WriteFileRequest write;
    write.path = require_string(object, "path");
    std::optional<std::string> data = get_bytes(object, "data");
    if (!data)
        throw CallError("missing_field", "missing \"data\" or \"data_b64\"");
    write.data = std::move(*data);
    if (std::optional<std::string> mode = optional_string(object, "mode"))
        write.mode = parse_mode(*mode);
    write.append = optional_bool(object, "append");
    write.user = parse_user(object);
    return write;
}

ResumeRequest parse_resume(const Json& object)
{
    ResumeRequest resume;
    const Json& time = require(object, "time_ns");
    if (!time.is_number_unsigned())
        bad_field("time_ns", "must be a non-negative integer (nanoseconds since the epoch)");
    resume.time_ns = time.get<uint64_t>();
    std::optional<std::string> entropy = get_bytes(object, "entropy");
    if (!entropy)
        throw CallError("missing_field", "missing \"entropy\" or \"entropy_b64\"");
    if (entropy->size() < min_resume_entropy || entropy->size() > max_resume_entropy)
        bad_field("entropy", "must be " + std::to_string(min_resume_entropy) + " to "
                      + std::to_string(max_resume_entropy) + " bytes");
    resume.entropy = std::move(*entropy);
    if (const auto it = object.find("pids_max"); it != object.end()) {
        if (!it->is_number_unsigned() || it->get<uint64_t>() == 0 || it->get<uint64_t>() > max_pids_max)
            bad_field("pids_max", "must be an integer from 1 to " + std::to_string(max_pids_max));
        resume.pids_max = it->get<uint32_t>();
    }
    return resume;
}

SnapshotRequest parse_snapshot(const Json& object)
{
    SnapshotRequest snapshot{require_string(object, "name")};
    const std::string& name = snapshot.name;
    if (name.empty() || name.size() > max_snapshot_name_bytes || name.front() == '.' ||
        name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != std::string::npos)
        bad_field("name", "must be 1 to " + std::to_string(max_snapshot_name_bytes)
                              + " letters, digits, '.', '_' or '-', not starting with '.'");
    return snapshot;
}

} // namespace

Request parse_request(std::string_view line)
{
    Json object;
    try {
        object = Json::parse(line);
    } catch (const Json::exception& e) {
        // Not only syntax: a number beyond a double's range (1e999) is out_of_range.
        throw RequestError{nullptr, CallError("bad_json", e.what())};
    }
    if (!object.is_object())
        throw RequestError{nullptr, CallError("bad_json", "a request must be a JSON object")};

    Request request;
    auto id = object.find("id");
    if (id == object.end())
        throw RequestError{nullptr, CallError("missing_field", "missing \"id\"")};
    if (!id->is_string() && !id->is_number())
        throw RequestError{nullptr, CallError("bad_field", "\"id\" must be a string or a number")};
    request.id = *id;

    try {
        const std::string op = require_string(object, "op");
        if (op == "exec")
            request.op = parse_exec(object);
        else if (op == "shell")
            request.op = parse_shell(object);
        else if (op == "run_code")
            request.op = parse_run_code(object);
        else if (op == "stat")
            request.op = StatRequest{require_string(object, "path"), parse_user(object)};
        else if (op == "list_dir")
            request.op = parse_list_dir(object);
        else if (op == "cancel")
            request.op = parse_cancel(object);
        else if (op == "write_file")
            request.op = parse_write_file(object);
        else if (op == "read_file")
            request.op = ReadFileRequest{require_string(object, "path"), parse_user(object)};
        else if (op == "close")
            request.op = CloseRequest{};
        else if (op == "resume")
            request.op = parse_resume(object);
        else if (op == "snapshot")
            request.op = parse_snapshot(object);
        else if (op == "spawn")
            request.op = parse_spawn(object);
        else if (op == "attach")
            request.op = parse_attach(object);
        else if (op == "list_processes")
            request.op = ListProcessesRequest{};
        else if (op == "send_stdin")
            request.op = parse_send_stdin(object);
        else if (op == "close_stdin")
            request.op = parse_close_stdin(object);
        else if (op == "signal")
            request.op = parse_signal(object);
        else if (op == "resize")
            request.op = parse_resize(object);
        else if (op == "create_context")
            request.op = parse_create_context(object);
        else if (op == "list_contexts")
            request.op = ListContextsRequest{};
        else if (op == "restart_context")
            request.op = parse_restart_context(object);
        else if (op == "remove_context")
            request.op = parse_remove_context(object);
        else if (op == "make_dir")
            request.op = parse_make_dir(object);
        else if (op == "move")
            request.op = parse_move(object);
        else if (op == "remove")
            request.op = parse_remove(object);
        else if (op == "watch")
            request.op = parse_watch(object);
        else
            throw CallError("unknown_op", "unknown op \"" + op + "\"");
    } catch (CallError& e) {
        throw RequestError{request.id, std::move(e)};
    }
    return request;
}

void put_bytes(Json& object, const std::string& name, std::string bytes)
{
    if (is_valid_utf8(bytes))
        object[name] = std::move(bytes);
    else
        object[name + "_b64"] = base64_encode(bytes);
}

std::optional<std::string> get_bytes(const Json& object, const std::string& name)
{
    const std::string b64_name = name + "_b64";
    auto plain = object.find(name);
    auto b64 = object.find(b64_name);
    const bool has_plain = plain != object.end() && !plain->is_null();
    const bool has_b64 = b64 != object.end() && !b64->is_null();
    if (has_plain && has_b64)
        bad_field(name, "and \"" + b64_name + "\" are exclusive");
    if (has_plain) {
        if (!plain->is_string())
            bad_field(name, "must be a string");
        return plain->get<std::string>();
    }
    if (has_b64) {
        if (!b64->is_string())
            bad_field(b64_name, "must be a base64 string");
        std::optional<std::string> bytes = base64_decode(b64->get_ref<const std::string&>());
        if (!bytes)
            bad_field(b64_name, "is not valid base64");
        return bytes;
    }
    return std::nullopt;
}

uint32_t parse_mode(const std::string& text)
{
    if (text.empty() || text.size() > 4)
        bad_field("mode", "must be 1-4 octal digits such as \"0644\"");
    uint32_t mode = 0;
    for (char c : text) {
        if (c < '0' || c > '7')
            bad_field("mode", "must be 1-4 octal digits such as \"0644\"");
        mode = mode * 8 + static_cast<uint32_t>(c - '0');
    }
    return mode;
}

std::string format_mode(uint32_t mode)
{
    char text[8];
    std::snprintf(text, sizeof(text), "%04o", mode & 07777);
    return text;
}

Json error_response(const Json& id, const std::string& code, const std::string& message)
{
    return Json{{"id", id}, {"error", {{"code", code}, {"message", message}}}};
}

namespace {

// How many bytes each byte takes in a JSON string as nlohmann's dump() writes it (not
// ensure_ascii): 2 for the short escapes, 6 for other control characters (\u00xx), else 1.
constexpr std::array<uint8_t, 256> escaped_size = [] {
    std::array<uint8_t, 256> size{};
    for (size_t c = 0; c < size.size(); ++c)
        size[c] = c >= 0x20 ? 1 : 6;
    for (char c : {'"', '\\', '\b', '\t', '\n', '\f', '\r'})
        size[static_cast<uint8_t>(c)] = 2;
    return size;
}();

char short_escape(uint8_t c)
{
    switch (c) {
    case '\b':
        return 'b';
    case '\t':
        return 't';
    case '\n':
        return 'n';
    case '\f':
        return 'f';
    case '\r':
        return 'r';
    default:
        return static_cast<char>(c);  // '"' and '\\' stand for themselves
    }
}

// Writes a message as compact JSON into out_, handing out_ to put_ (which may stop the
// writing) whenever it has grown past piece_ bytes, so that no piece holds much more than
// piece_ bytes however long the line.
class LineWriter {
public:
    LineWriter(size_t piece, const std::function<bool(std::string_view)>* put) : piece_(piece), put_(put) {}

    bool json(const Json& value)
    {
        switch (value.type()) {
        case Json::value_t::object: {
            out_ += '{';
            bool first = true;
            for (const auto& [key, member] : value.items()) {
                if (!first)
                    out_ += ',';
                first = false;
                if (!string(key))
                    return false;
                out_ += ':';
                if (!json(member))
                    return false;
            }
            out_ += '}';
            return true;
        }
        case Json::value_t::array: {
            out_ += '[';
            bool first = true;
            for (const Json& element : value) {
                if (!first)
                    out_ += ',';
                first = false;
                if (!json(element))
                    return false;
            }
            out_ += ']';
            return true;
        }
        case Json::value_t::string:
            return string(value.get_ref<const std::string&>());
        default:
            out_ += value.dump();  // numbers, booleans, null
            return true;
        }
    }

    // Hands over what is left; the caller adds the line's end.
    std::string& rest() { return out_; }

private:
    bool string(std::string_view text)
    {
        // nlohmann replaces invalid UTF-8 (error_handler_t::replace); only messages can
        // hold it, since byte fields went through put_bytes, and they are short.
        if (!is_valid_utf8(text)) {
            out_ += Json(text).dump(-1, ' ', false, Json::error_handler_t::replace);
            return true;
        }
        out_ += '"';
        // A slice escapes to at most six times its size.
        const size_t slice = std::max<size_t>(piece_ / 6, 4096);
        for (size_t at = 0; at < text.size(); at += slice) {
            append_escaped(text.substr(at, slice));
            if (!maybe_put())
                return false;
        }
        out_ += '"';
        return true;
    }

    void append_escaped(std::string_view text)
    {
        size_t size = 0;
        for (const char c : text)
            size += escaped_size[static_cast<uint8_t>(c)];
        const size_t start = out_.size();
        out_.resize(start + size);
        char* p = out_.data() + start;
        for (const char ch : text) {
            const auto c = static_cast<uint8_t>(ch);
            switch (escaped_size[c]) {
            case 1:
                *p++ = ch;
                break;
            case 2:
                *p++ = '\\';
                *p++ = short_escape(c);
                break;
            default:
                constexpr char hex[] = "0123456789abcdef";
                std::memcpy(p, "\\u00", 4);
                p[4] = hex[c >> 4];
                p[5] = hex[c & 0xf];
                p += 6;
            }
        }
    }

    bool maybe_put()
    {
        if (!put_ || out_.size() < piece_)
            return true;
        const bool go_on = (*put_)(out_);
        out_.clear();
        return go_on;
    }

    std::string out_;
    size_t piece_;
    const std::function<bool(std::string_view)>* put_;
};

} // namespace

// Both write the same bytes as message.dump(-1, ' ', false, replace), without it: dump()
// escapes each control character with its own snprintf, and 16 MiB of NULs in a response
// (96 MiB escaped) then took some 30 s to encode in the emulated test host, a silence long
// enough for the host's watchdog to give up on the call.
std::string to_line(const Json& message)
{
    LineWriter writer(std::numeric_limits<size_t>::max(), nullptr);
    writer.json(message);
    std::string line = std::move(writer.rest());
    line += '\n';
    return line;
}

bool write_line(const Json& message, size_t piece, const std::function<bool(std::string_view)>& put)
{
    LineWriter writer(piece, &put);
    if (!writer.json(message))
        return false;
    writer.rest() += '\n';
    return put(writer.rest());
}

} // namespace agentvm
