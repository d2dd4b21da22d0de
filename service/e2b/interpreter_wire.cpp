#include "service/e2b/interpreter_wire.hpp"

#include <time.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <utility>

#include <fmt/format.h>

#include "service/problem.hpp"

namespace agentvm {
namespace {

// The MIME forms the SDK names, and the key each takes in a result line (E2B's server's
// Result model). Any other form goes under its MIME type, which the SDK keeps in `extra`.
constexpr std::array<std::pair<std::string_view, std::string_view>, 11> form_keys{{
    {"text/plain", "text"},
    {"text/html", "html"},
    {"text/markdown", "markdown"},
    {"image/svg+xml", "svg"},
    {"image/png", "png"},
    {"image/jpeg", "jpeg"},
    {"application/pdf", "pdf"},
    {"text/latex", "latex"},
    {"application/json", "json"},
    {"application/javascript", "javascript"},
    {"e2b/data", "data"},
}};

// A field that may be absent or null (JSON.stringify keeps a null the caller passed).
const Json* optional_field(const Json& body, const char* name)
{
    const auto found = body.find(name);
    return found == body.end() || found->is_null() ? nullptr : &*found;
}

std::optional<std::string> optional_string(const Json& body, const char* name)
{
    const Json* value = optional_field(body, name);
    if (!value)
        return std::nullopt;
    if (!value->is_string())
        throw_bad_field(fmt::format("\"{}\" must be a string", name));
    return value->get<std::string>();
}

// E2B's server shows a text/plain form without the quotes of a Python string's repr.
std::string shown_text(std::string text)
{
    if (text.size() >= 2 && text.front() == '\'' && text.back() == '\'')
        return text.substr(1, text.size() - 2);
    return text;
}

// How long the UTF-8 sequence `lead` starts is; 0 for a byte that starts none.
size_t sequence_length(unsigned char lead)
{
    if (lead < 0x80)
        return 1;
    if ((lead & 0xE0) == 0xC0)
        return 2;
    if ((lead & 0xF0) == 0xE0)
        return 3;
    if ((lead & 0xF8) == 0xF0)
        return 4;
    return 0;
}

} // namespace

std::optional<std::string> agent_language(std::string_view e2b_language)
{
    std::string name(e2b_language);
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    if (name.empty() || name == "python" || name == "python3")
        return "python";
    if (name == "bash")
        return "bash";
    return std::nullopt;
}

std::string unsupported_language_message(std::string_view e2b_language)
{
    return fmt::format("agentvm runs python and bash code, not \"{}\"", e2b_language);
}

ExecuteRequest parse_execute_request(const Json& body)
{
    ExecuteRequest request;
    const Json* code = optional_field(body, "code");
    if (!code)
        throw RefusedRequest(ServiceError::missing_field, "\"code\" is required");
    if (!code->is_string())
        throw_bad_field("\"code\" must be a string");
    request.code = code->get<std::string>();
    request.context = optional_string(body, "context_id");
    if (request.context && request.context->empty())
        throw_bad_field("\"context_id\" must not be empty");
    if (const std::optional<std::string> language = optional_string(body, "language")) {
        if (request.context)
            throw_bad_field("only one of \"context_id\" and \"language\" may be given");
        request.language = agent_language(*language);
        if (!request.language)
            request.unsupported_language = *language;
    }
    if (const Json* env = optional_field(body, "env_vars")) {
        if (!env->is_object())
            throw_bad_field("\"env_vars\" must be an object of strings");
        for (const auto& [name, value] : env->items())
            if (!value.is_string())
                throw_bad_field(fmt::format("\"env_vars\": \"{}\" must be a string", name));
        if (!env->empty())
            request.env = *env;
    }
    return request;
}

ContextRequest parse_context_request(const Json& body)
{
    ContextRequest request;
    if (const std::optional<std::string> language = optional_string(body, "language")) {
        request.language = agent_language(*language);
        if (!request.language)
            throw_bad_field(unsupported_language_message(*language));
    }
    request.cwd = optional_string(body, "cwd");
    if (request.cwd && request.cwd->empty())
        request.cwd.reset();
    return request;
}

Json context_json(const Json& agent_context)
{
    return Json{{"id", agent_context.value("context", "")},
                {"language", agent_context.value("language", "python")},
                {"cwd", agent_context.value("cwd", "")}};
}

std::string Utf8Carry::take(std::string_view bytes)
{
    held_.append(bytes);
    // Look back over at most 3 bytes for the lead byte of a character not whole yet.
    size_t keep = 0;
    for (size_t back = 1; back <= 3 && back <= held_.size(); ++back) {
        const auto byte = static_cast<unsigned char>(held_[held_.size() - back]);
        if ((byte & 0xC0) == 0x80)
            continue;  // a continuation byte: its lead is further back
        const size_t length = sequence_length(byte);
        if (length > back)
            keep = back;
        break;
    }
    std::string text = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return text;
}

std::vector<Json> ExecutionLines::event(const Json& event, const std::string& timestamp)
{
    std::vector<Json> lines;
    const std::string kind = event.value("event", "");
    if (kind == "stdout" || kind == "stderr") {
        std::optional<std::string> bytes;
        try {
            bytes = get_bytes(event, "data");
        } catch (const CallError&) {
            // A malformed event carries nothing; the cell's answer still comes.
        }
        if (!bytes)
            return lines;
        std::string text = (kind == "stdout" ? stdout_ : stderr_).take(*bytes);
        if (!text.empty())
            lines.push_back(output_line(kind, std::move(text), timestamp));
    } else if (kind == "display") {
        const Json formats = event.value("formats", Json::object());
        if (formats.is_object() && !formats.empty())
            lines.push_back(result_line(formats, false, std::nullopt));
    }
    return lines;
}

std::vector<Json> ExecutionLines::answer(const Json& answer, const std::string& timestamp)
{
    std::vector<Json> lines;
    for (const auto& [stream, carry] :
         {std::pair<std::string_view, Utf8Carry*>{"stdout", &stdout_}, std::pair<std::string_view, Utf8Carry*>{"stderr", &stderr_}})
        if (std::string rest = carry->flush(); !rest.empty())
            lines.push_back(output_line(stream, std::move(rest), timestamp));
    if (answer.contains("error")) {
        const Json& error = answer["error"];
        lines.push_back(error_line(error.is_object() ? error.value("code", "internal") : "internal",
                                   error.is_object() ? error.value("message", "") : "", ""));
        return lines;
    }
    if (const auto result = answer.find("result"); result != answer.end() && result->is_string())
        lines.push_back(result_line(answer.value("formats", Json::object()), true, result->get<std::string>()));
    const auto exception = answer.find("exception");
    if (exception != answer.end() && exception->is_object()) {
        const Json traceback = exception->value("traceback", Json());
        lines.push_back(error_line(exception->value("type", "Error"), exception->value("message", ""),
                                   traceback.is_string() ? traceback.get<std::string>() : ""));
    } else if (answer.value("cancelled", false)) {
        lines.push_back(error_line("CellCancelled",
                                   "the cell was cancelled before it ran: its context was restarted", ""));
    }
    return lines;
}

Json output_line(std::string_view stream, std::string text, const std::string& timestamp)
{
    return Json{{"type", stream}, {"text", std::move(text)}, {"timestamp", timestamp}};
}

Json result_line(const Json& formats, bool is_main_result, const std::optional<std::string>& text)
{
    Json line{{"type", "result"}, {"is_main_result", is_main_result}};
    if (text)
        line["text"] = shown_text(*text);
    if (!formats.is_object())
        return line;
    for (const auto& item : formats.items()) {
        const std::string& mime = item.key();
        const Json& value = item.value();
        const auto known = std::find_if(form_keys.begin(), form_keys.end(),
                                        [&](const auto& entry) { return entry.first == mime; });
        if (known != form_keys.end()) {
            if (known->second == "text") {
                if (!text && value.is_string())
                    line["text"] = shown_text(value.get<std::string>());
                continue;
            }
            line[std::string(known->second)] = value;
        } else if (mime.find('/') != std::string::npos) {
            // A MIME type never collides with the line's own keys, which have no '/'.
            line[mime] = value;
        }
    }
    return line;
}

Json error_line(std::string name, std::string value, std::string traceback)
{
    return Json{{"type", "error"}, {"name", std::move(name)}, {"value", std::move(value)},
                {"traceback", std::move(traceback)}};
}

Json executions_line(uint64_t execution_count)
{
    return Json{{"type", "number_of_executions"}, {"execution_count", execution_count}};
}

Json end_of_execution_line()
{
    return Json{{"type", "end_of_execution"}};
}

std::string ndjson_line(const Json& line)
{
    // ASCII only (\uXXXX escapes): the SDK decodes each piece of the body as it comes with a
    // fresh TextDecoder, so a character cut between two pieces (anywhere, at the transport's
    // will) would become two U+FFFD in its output.
    return line.dump(-1, ' ', true, Json::error_handler_t::replace) + "\n";
}

std::string line_timestamp()
{
    const auto now = std::chrono::system_clock::now();
    const auto micros =
        std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
    const time_t seconds = std::chrono::system_clock::to_time_t(now);
    tm utc{};
    gmtime_r(&seconds, &utc);
    return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z", utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday,
                       utc.tm_hour, utc.tm_min, utc.tm_sec, micros);
}

} // namespace agentvm
