// What the episode relay must know of each line the agent sends: whose call it is about,
// whether it ends the call, whether it says the call was killed, and that it is a JSON object
// at all. Read by a push scanner that is fed the line in pieces as they arrive and keeps only
// a few small fields, so a response carrying hundreds of MiB of escaped output passes through
// without ever being held whole.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/json_depth.hpp"

namespace agentvm {

struct ResponseSummary {
    // The top-level "id" as compact JSON text ("7", "\"a\"", "null"), comparable with
    // Json::dump() of the request's id; nullopt when absent, not a scalar, or longer than
    // max_id_bytes as written.
    std::optional<std::string> id;
    bool is_event = false;  // has an "event" member: more lines about this call follow
    // Top-level "timed_out" / "cancelled" are true: a shell call's answer then says its shell
    // was killed (the next call starts a fresh one).
    bool timed_out = false;
    bool cancelled = false;
};

// The longest id the relay keeps track of, as compact JSON (the episode refuses requests
// with a longer one, so no pending call has one).
constexpr size_t max_id_bytes = 1024;

// Checks one line's JSON (RFC 8259, strings UTF-8 with paired surrogates) as it arrives,
// with memory bounded by max_id_bytes and the nesting depth, whatever the line's length.
class ResponseScanner {
public:
    // No line nests deeper than this in the protocol; deeper is not a protocol line.
    static constexpr size_t max_depth = max_json_depth;

    // The next bytes of the line (no '\n' in them). False once the line is not a JSON object.
    bool feed(std::string_view bytes);
    // The line has ended: its summary, or nullopt when it is not one whole JSON object.
    // Ready for the next line afterwards.
    std::optional<ResponseSummary> finish();
    // The top-level "id" once its value has arrived whole (the agent writes it first).
    const std::optional<std::string>& id() const { return summary_.id; }

private:
    enum class Expect : uint8_t { top, key_or_close, key, colon, value, value_or_close, comma_or_close, done };
    enum class Token : uint8_t { none, string, number, literal };
    // The top-level boolean a value is read for.
    enum class Flag : uint8_t { none, timed_out, cancelled };

    bool structural(char c);
    bool begin_value(char c);
    bool close();
    bool string_byte(uint8_t c);
    bool escape_byte(uint8_t c);
    bool number_byte(char c, bool& consumed);
    void end_value();
    void end_string();
    void capture(std::string_view bytes);
    void set_flag(Flag flag, bool value);

    std::vector<bool> stack_;  // open containers: true for an object
    Expect expect_ = Expect::top;
    Token token_ = Token::none;
    bool failed_ = false;
    // Inside a string.
    bool escaped_ = false;   // after a backslash
    int hex_left_ = 0;       // hex digits still due in a \u escape
    uint32_t unit_ = 0;      // the \u escape's code unit so far
    bool want_low_ = false;  // a high surrogate was escaped: a low one must follow
    int utf8_left_ = 0;      // continuation bytes still due
    uint8_t utf8_min_ = 0x80, utf8_max_ = 0xbf;  // range of the next continuation byte
    bool is_key_ = false;
    // Inside a number or literal.
    uint8_t number_state_ = 0;
    std::string_view literal_;
    size_t literal_at_ = 0;
    // The top-level key being read, and the top-level "id" value being read, as written.
    std::string key_;
    std::string id_text_;
    bool capturing_key_ = false;
    bool capturing_id_ = false;
    bool value_is_id_ = false;
    Flag key_flag_ = Flag::none;    // the top-level key just read names a flag
    Flag value_flag_ = Flag::none;  // the value being read is that flag's
    ResponseSummary summary_;
};

// One whole line at once; nullopt when it is not a JSON object.
std::optional<ResponseSummary> summarize_response(std::string_view line);

} // namespace agentvm
