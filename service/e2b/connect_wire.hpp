// Connect-RPC's wire as envd's clients speak it (connectrpc.com/docs/protocol; docs/e2b.md,
// "envd"), JSON codec only: the content types, the 5-byte envelopes of a server stream (a flags
// byte, a big-endian length, the message) and its end-of-stream message, the
// Connect-Timeout-Ms header, and proto3's JSON mapping of the request messages (either key
// spelling, int64 as a number or a string, bytes as either base64 alphabet, enums by name or
// number, unknown keys ignored). Pure: no sockets, no sandbox, so all of it is unit-tested and
// fuzzed. Nothing here knows envd's messages; envd_process and envd_filesystem do.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "protocol/agent_protocol.hpp"

namespace agentvm {

// An RPC's failure as Connect carries it: a code name ("invalid_argument") and a message.
struct ConnectError {
    std::string code;
    std::string message;
};

// Thrown while a request is read or mapped; the RPC answers it, unary or in the stream's end.
class ConnectFailure : public std::runtime_error {
public:
    ConnectFailure(std::string code, const std::string& message) : std::runtime_error(message), code_(std::move(code)) {}
    ConnectError error() const { return {code_, what()}; }
    const std::string& code() const { return code_; }

private:
    std::string code_;
};

[[noreturn]] void throw_invalid_argument(const std::string& message);

// One request message, envelope or not, may be this long: the largest envd takes is
// SendInput's, stdin in base64.
inline constexpr size_t max_connect_message = size_t{4} << 20;
inline constexpr size_t envelope_header_size = 5;
inline constexpr uint8_t envelope_compressed = 0x01;
inline constexpr uint8_t envelope_end_stream = 0x02;

inline constexpr const char* connect_unary_type = "application/json";
inline constexpr const char* connect_stream_type = "application/connect+json";

// Whether a request's Content-Type is the JSON codec of a unary call ("application/json",
// any case, parameters such as "; charset=utf-8" allowed) or of a stream's.
bool is_unary_json(std::string_view content_type);
bool is_stream_json(std::string_view content_type);

// A message envelope, or the end-of-stream one.
std::string connect_envelope(std::string_view message, uint8_t flags = 0);
// The end-of-stream envelope: {} for success, else {"error":{"code","message"}}.
std::string connect_end_stream(const std::optional<ConnectError>& error);
// A unary error's body.
std::string connect_error_body(const ConnectError& error);

// The message of a server-streaming request's body: exactly one uncompressed envelope whose
// length is what it says and at most `max_message`. Throws ConnectFailure (invalid_argument,
// or resource_exhausted for a message over the limit).
std::string_view single_envelope_message(std::string_view body, size_t max_message = max_connect_message);

// A request message's JSON: an object (an empty body is the empty message), nested at most
// max_json_depth. Throws ConnectFailure (invalid_argument).
Json parse_connect_message(std::string_view text);

// Connect-Timeout-Ms: 1 to 10 digits of milliseconds. nullopt when absent; a malformed value
// throws ConnectFailure (invalid_argument).
std::optional<std::chrono::milliseconds> connect_timeout(const std::optional<std::string>& header);

// Reads one message under proto3's JSON mapping. Each field is named twice: its JSON name
// (camelCase) and its proto name (snake_case); a message carrying both is refused, as protobuf's
// parsers do. A field absent or null reads as its default. Type errors throw ConnectFailure
// (invalid_argument) naming the field by its path from the request's root.
class MessageReader {
public:
    MessageReader(const Json& message, std::string where = "");

    bool has(std::string_view json_name, std::string_view proto_name) const;
    std::string string(std::string_view json_name, std::string_view proto_name) const;
    bool boolean(std::string_view json_name, std::string_view proto_name) const;
    int64_t int64(std::string_view json_name, std::string_view proto_name) const;
    uint32_t uint32(std::string_view json_name, std::string_view proto_name) const;
    // bytes: standard or URL-safe base64, padded or not.
    std::string bytes(std::string_view json_name, std::string_view proto_name) const;
    std::vector<std::string> strings(std::string_view json_name, std::string_view proto_name) const;
    std::map<std::string, std::string> string_map(std::string_view json_name, std::string_view proto_name) const;
    // An enum by its value's name or number (0 when absent or null). `values` maps the names
    // to their numbers; a name or number not in it is refused.
    int enum_value(std::string_view json_name, std::string_view proto_name,
                   std::span<const std::pair<std::string_view, int>> values) const;
    // A nested message (an empty one when absent).
    MessageReader message(std::string_view json_name, std::string_view proto_name) const;

private:
    // The field's value, nullptr when absent or null.
    const Json* find(std::string_view json_name, std::string_view proto_name) const;
    std::string field_path(std::string_view json_name) const;
    int64_t integer(std::string_view json_name, std::string_view proto_name, int64_t min, int64_t max) const;

    const Json* message_;
    std::string where_;
};

// `object`'s member `key`, or null when it has none (or is no object): a const Json's
// operator[] must not be asked for a key it lacks.
const Json& json_field(const Json& object, std::string_view key);

// Proto3 JSON's base64 for bytes: the standard alphabet, padded (what protobuf's printers
// write and every parser reads).
std::string proto_bytes(std::string_view bytes);

} // namespace agentvm
