#include "service/e2b/connect_wire.hpp"

#include <algorithm>
#include <cctype>
#include <limits>

#include <fmt/format.h>

#include "common/base64.hpp"
#include "protocol/json_depth.hpp"
#include "service/e2b/e2b_request.hpp"

namespace agentvm {
namespace {

std::string text_of(const Json& message)
{
    return message.dump(-1, ' ', false, Json::error_handler_t::replace);
}

const Json& empty_message()
{
    static const Json empty = Json::object();
    return empty;
}

} // namespace

void throw_invalid_argument(const std::string& message)
{
    throw ConnectFailure("invalid_argument", message);
}

bool is_unary_json(std::string_view content_type)
{
    return media_type(content_type) == connect_unary_type;
}

bool is_stream_json(std::string_view content_type)
{
    return media_type(content_type) == connect_stream_type;
}

std::string connect_envelope(std::string_view message, uint8_t flags)
{
    const auto length = static_cast<uint32_t>(message.size());
    std::string out;
    out.reserve(envelope_header_size + message.size());
    out += static_cast<char>(flags);
    for (int shift = 24; shift >= 0; shift -= 8)
        out += static_cast<char>((length >> shift) & 0xff);
    out += message;
    return out;
}

std::string connect_end_stream(const std::optional<ConnectError>& error)
{
    Json end = Json::object();
    if (error)
        end["error"] = Json{{"code", error->code}, {"message", error->message}};
    return connect_envelope(text_of(end), envelope_end_stream);
}

std::string connect_error_body(const ConnectError& error)
{
    return text_of(Json{{"code", error.code}, {"message", error.message}});
}

std::string_view single_envelope_message(std::string_view body, size_t max_message)
{
    if (body.size() < envelope_header_size)
        throw_invalid_argument(fmt::format("the request body is {} bytes: a stream's request is one envelope, "
                                           "a 5-byte header and its message",
                                           body.size()));
    const auto flags = static_cast<uint8_t>(body[0]);
    if (flags & envelope_compressed)
        throw_invalid_argument("the request envelope is compressed: this server takes identity encoding only");
    if (flags != 0)
        throw_invalid_argument(fmt::format("the request envelope has flags 0x{:02x}: a request message has none", flags));
    uint64_t length = 0;
    for (size_t i = 1; i < envelope_header_size; ++i)
        length = (length << 8) | static_cast<uint8_t>(body[i]);
    if (length > max_message)
        throw ConnectFailure("resource_exhausted",
                             fmt::format("the request message is {} bytes; at most {} are taken", length, max_message));
    const size_t rest = body.size() - envelope_header_size;
    if (length > rest)
        throw_invalid_argument(
            fmt::format("the request envelope says {} bytes but {} follow: the body is truncated", length, rest));
    if (length < rest)
        throw_invalid_argument("the request body holds more than one envelope: a server stream takes one message");
    return body.substr(envelope_header_size);
}

Json parse_connect_message(std::string_view text)
{
    if (text.empty())
        return Json::object();
    if (!json_depth_within(text))
        throw_invalid_argument(fmt::format("the message nests deeper than {} levels", max_json_depth));
    Json message = Json::parse(text, nullptr, false);
    if (message.is_discarded())
        throw_invalid_argument("the message is not valid JSON");
    if (!message.is_object())
        throw_invalid_argument("the message must be a JSON object");
    return message;
}

std::optional<std::chrono::milliseconds> connect_timeout(const std::optional<std::string>& header)
{
    if (!header)
        return std::nullopt;
    const std::string& text = *header;
    if (text.empty() || text.size() > 10 || text.find_first_not_of("0123456789") != std::string::npos)
        throw_invalid_argument(fmt::format("Connect-Timeout-Ms is \"{}\": it must be 1 to 10 digits", text));
    return std::chrono::milliseconds(std::stoll(text));
}

const Json& json_field(const Json& object, std::string_view key)
{
    static const Json null_value;
    if (!object.is_object())
        return null_value;
    const auto found = object.find(key);
    return found == object.end() ? null_value : *found;
}

std::string proto_bytes(std::string_view bytes)
{
    return base64_encode(bytes);
}

MessageReader::MessageReader(const Json& message, std::string where) : message_(&message), where_(std::move(where))
{
    if (!message.is_object())
        throw_invalid_argument(fmt::format("{} must be a JSON object", where_.empty() ? "the message" : where_));
}

std::string MessageReader::field_path(std::string_view json_name) const
{
    return where_.empty() ? fmt::format("\"{}\"", json_name) : fmt::format("\"{}.{}\"", where_, json_name);
}

const Json* MessageReader::find(std::string_view json_name, std::string_view proto_name) const
{
    const auto camel = message_->find(json_name);
    const auto snake = json_name == proto_name ? message_->end() : message_->find(proto_name);
    if (camel != message_->end() && snake != message_->end())
        throw_invalid_argument(
            fmt::format("{} is given twice, also as \"{}\": send one spelling", field_path(json_name), proto_name));
    const auto found = camel != message_->end() ? camel : snake;
    if (found == message_->end() || found->is_null())
        return nullptr;
    return &*found;
}

bool MessageReader::has(std::string_view json_name, std::string_view proto_name) const
{
    return find(json_name, proto_name) != nullptr;
}

std::string MessageReader::string(std::string_view json_name, std::string_view proto_name) const
{
    const Json* value = find(json_name, proto_name);
    if (!value)
        return {};
    if (!value->is_string())
        throw_invalid_argument(fmt::format("{} must be a string", field_path(json_name)));
    return value->get<std::string>();
}

bool MessageReader::boolean(std::string_view json_name, std::string_view proto_name) const
{
    const Json* value = find(json_name, proto_name);
    if (!value)
        return false;
    if (!value->is_boolean())
        throw_invalid_argument(fmt::format("{} must be true or false", field_path(json_name)));
    return value->get<bool>();
}

int64_t MessageReader::integer(std::string_view json_name, std::string_view proto_name, int64_t min, int64_t max) const
{
    const Json* value = find(json_name, proto_name);
    if (!value)
        return 0;
    const std::string name = field_path(json_name);
    const auto refuse = [&] {
        throw_invalid_argument(fmt::format("{} must be an integer from {} to {}, as a number or a string", name, min, max));
    };
    if (value->is_number_integer()) {
        if (value->is_number_unsigned()) {
            const uint64_t n = value->get<uint64_t>();
            if (n > static_cast<uint64_t>(max))
                refuse();
            return static_cast<int64_t>(n);
        }
        const int64_t n = value->get<int64_t>();
        if (n < min || n > max)
            refuse();
        return n;
    }
    if (!value->is_string())
        refuse();
    // proto3 JSON writes 64-bit integers as decimal strings.
    const std::string& text = value->get_ref<const std::string&>();
    const bool negative = !text.empty() && text[0] == '-';
    const std::string_view digits = std::string_view(text).substr(negative ? 1 : 0);
    if (digits.empty() || digits.size() > 19 || digits.find_first_not_of("0123456789") != std::string_view::npos)
        refuse();
    const uint64_t magnitude = std::stoull(std::string(digits));
    if (negative) {
        if (magnitude > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + 1)
            refuse();
        const int64_t n = magnitude == static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + 1
                              ? std::numeric_limits<int64_t>::min()
                              : -static_cast<int64_t>(magnitude);
        if (n < min)
            refuse();
        return n;
    }
    if (magnitude > static_cast<uint64_t>(max))
        refuse();
    return static_cast<int64_t>(magnitude);
}

int64_t MessageReader::int64(std::string_view json_name, std::string_view proto_name) const
{
    return integer(json_name, proto_name, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
}

uint32_t MessageReader::uint32(std::string_view json_name, std::string_view proto_name) const
{
    return static_cast<uint32_t>(integer(json_name, proto_name, 0, std::numeric_limits<uint32_t>::max()));
}

std::string MessageReader::bytes(std::string_view json_name, std::string_view proto_name) const
{
    const Json* value = find(json_name, proto_name);
    if (!value)
        return {};
    if (!value->is_string())
        throw_invalid_argument(fmt::format("{} must be a base64 string", field_path(json_name)));
    std::string text = value->get<std::string>();
    // Either alphabet, padding optional: made canonical for the strict decoder.
    for (char& c : text) {
        if (c == '-')
            c = '+';
        else if (c == '_')
            c = '/';
    }
    if (text.size() % 4 == 1)
        throw_invalid_argument(fmt::format("{} is not valid base64", field_path(json_name)));
    if (text.find('=') == std::string::npos)
        text.append((4 - text.size() % 4) % 4, '=');
    std::optional<std::string> decoded = base64_decode(text);
    if (!decoded)
        throw_invalid_argument(fmt::format("{} is not valid base64", field_path(json_name)));
    return std::move(*decoded);
}

std::vector<std::string> MessageReader::strings(std::string_view json_name, std::string_view proto_name) const
{
    const Json* value = find(json_name, proto_name);
    if (!value)
        return {};
    if (!value->is_array())
        throw_invalid_argument(fmt::format("{} must be an array of strings", field_path(json_name)));
    std::vector<std::string> out;
    out.reserve(value->size());
    for (const Json& item : *value) {
        if (!item.is_string())
            throw_invalid_argument(fmt::format("{} must be an array of strings", field_path(json_name)));
        out.push_back(item.get<std::string>());
    }
    return out;
}

std::map<std::string, std::string> MessageReader::string_map(std::string_view json_name,
                                                             std::string_view proto_name) const
{
    const Json* value = find(json_name, proto_name);
    if (!value)
        return {};
    if (!value->is_object())
        throw_invalid_argument(fmt::format("{} must be an object of strings", field_path(json_name)));
    std::map<std::string, std::string> out;
    for (const auto& [key, item] : value->items()) {
        if (!item.is_string())
            throw_invalid_argument(fmt::format("{} must be an object of strings", field_path(json_name)));
        out[key] = item.get<std::string>();
    }
    return out;
}

int MessageReader::enum_value(std::string_view json_name, std::string_view proto_name,
                              std::span<const std::pair<std::string_view, int>> values) const
{
    const Json* value = find(json_name, proto_name);
    if (!value)
        return 0;
    for (const auto& [name, number] : values) {
        if (value->is_string() && value->get_ref<const std::string&>() == name)
            return number;
        if (value->is_number_integer() && !value->is_number_unsigned() && value->get<int64_t>() == number)
            return number;
        if (value->is_number_unsigned() && number >= 0 && value->get<uint64_t>() == static_cast<uint64_t>(number))
            return number;
    }
    std::string names;
    for (const auto& [name, number] : values)
        names += fmt::format("{}{} ({})", names.empty() ? "" : ", ", name, number);
    throw_invalid_argument(fmt::format("{} must be one of {}", field_path(json_name), names));
}

MessageReader MessageReader::message(std::string_view json_name, std::string_view proto_name) const
{
    const Json* value = find(json_name, proto_name);
    const std::string path = where_.empty() ? std::string(json_name) : fmt::format("{}.{}", where_, json_name);
    return MessageReader(value ? *value : empty_message(), path);
}

} // namespace agentvm
