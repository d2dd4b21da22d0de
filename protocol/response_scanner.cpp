#include "protocol/response_scanner.hpp"

#include <array>
#include <utility>

#include <nlohmann/json.hpp>

namespace agentvm {
namespace {

// Raw spelling of a top-level key kept to tell "id" and "event" apart from the rest, escapes
// included ("\u0065\u0076\u0065\u006e\u0074" is "event").
constexpr size_t max_key_bytes = 64;

bool is_json_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

// String bytes that need no state: printable ASCII but the quote and the backslash. The bulk
// of a response (its output, escapes aside) is these, so they are skipped in one loop.
constexpr std::array<bool, 256> plain_in_string = [] {
    std::array<bool, 256> plain{};
    for (size_t c = 0x20; c < 0x80; ++c)
        plain[c] = c != '"' && c != '\\';
    return plain;
}();

// Number states, after: a minus; a leading zero; integer digits; the point; fraction
// digits; the exponent's e; its sign; exponent digits.
enum : uint8_t { n_minus, n_zero, n_int, n_point, n_frac, n_e, n_e_sign, n_exp };

bool number_may_end(uint8_t state)
{
    return state == n_zero || state == n_int || state == n_frac || state == n_exp;
}

int hex_value(uint8_t c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

} // namespace

bool ResponseScanner::feed(std::string_view bytes)
{
    for (size_t i = 0; i < bytes.size() && !failed_; ++i) {
        const char c = bytes[i];
        switch (token_) {
        case Token::string:
            if (!escaped_ && utf8_left_ == 0 && !want_low_ && plain_in_string[static_cast<uint8_t>(c)]) {
                size_t end = i + 1;
                while (end < bytes.size() && plain_in_string[static_cast<uint8_t>(bytes[end])])
                    ++end;
                capture(bytes.substr(i, end - i));
                i = end - 1;
                continue;
            }
            capture({&c, 1});
            failed_ = !(escaped_ ? escape_byte(static_cast<uint8_t>(c)) : string_byte(static_cast<uint8_t>(c)));
            continue;
        case Token::number: {
            bool consumed = true;
            failed_ = !number_byte(c, consumed);
            if (failed_ || consumed) {
                if (consumed)
                    capture({&c, 1});
                continue;
            }
            end_value();
            break;  // the byte after the number is structure
        }
        case Token::literal:
            capture({&c, 1});
            if (c != literal_[literal_at_++])
                failed_ = true;
            else if (literal_at_ == literal_.size())
                end_value();
            continue;
        case Token::none:
            break;
        }
        failed_ = !structural(c);
    }
    return !failed_;
}

std::optional<ResponseSummary> ResponseScanner::finish()
{
    const bool whole = !failed_ && expect_ == Expect::done && token_ == Token::none;
    std::optional<ResponseSummary> summary;
    if (whole)
        summary = std::move(summary_);
    *this = ResponseScanner();
    return summary;
}

bool ResponseScanner::structural(char c)
{
    if (is_json_space(c))
        return true;
    switch (expect_) {
    case Expect::top:
        if (c != '{')
            return false;
        stack_.push_back(true);
        expect_ = Expect::key_or_close;
        return true;
    case Expect::key_or_close:
    case Expect::key:
        if (c == '}' && expect_ == Expect::key_or_close)
            return close();
        if (c != '"')
            return false;
        token_ = Token::string;
        is_key_ = true;
        capturing_key_ = stack_.size() == 1;
        key_.assign(1, c);
        return true;
    case Expect::colon:
        if (c != ':')
            return false;
        expect_ = Expect::value;
        return true;
    case Expect::value_or_close:
        if (c == ']')
            return close();
        return begin_value(c);
    case Expect::value:
        return begin_value(c);
    case Expect::comma_or_close:
        if (c == ',') {
            expect_ = stack_.back() ? Expect::key : Expect::value;
            return true;
        }
        if (c == (stack_.back() ? '}' : ']'))
            return close();
        return false;
    case Expect::done:
        return false;
    }
    return false;
}

bool ResponseScanner::begin_value(char c)
{
    capturing_id_ = value_is_id_;
    value_is_id_ = false;
    if (capturing_id_)
        id_text_.clear();
    // Anything but a literal true says false; JSON's last duplicate wins, as for the harness.
    value_flag_ = std::exchange(key_flag_, Flag::none);
    set_flag(value_flag_, false);
    if (c == '{' || c == '[') {
        value_flag_ = Flag::none;
        // A structured "id" is no id at all: the agent only ever echoes scalars.
        if (capturing_id_)
            summary_.id.reset();
        capturing_id_ = false;
        if (stack_.size() >= max_depth)
            return false;
        stack_.push_back(c == '{');
        expect_ = c == '{' ? Expect::key_or_close : Expect::value_or_close;
        return true;
    }
    capture({&c, 1});
    if (c == '"') {
        token_ = Token::string;
        is_key_ = false;
        return true;
    }
    if (c == '-' || is_digit(c)) {
        token_ = Token::number;
        number_state_ = c == '-' ? n_minus : c == '0' ? n_zero : n_int;
        return true;
    }
    for (const std::string_view literal : {"true", "false", "null"}) {
        if (c == literal[0]) {
            token_ = Token::literal;
            literal_ = literal;
            literal_at_ = 1;
            return true;
        }
    }
    return false;
}

bool ResponseScanner::close()
{
    stack_.pop_back();
    expect_ = stack_.empty() ? Expect::done : Expect::comma_or_close;
    return true;
}

bool ResponseScanner::string_byte(uint8_t c)
{
    if (utf8_left_ > 0) {
        if (c < utf8_min_ || c > utf8_max_)
            return false;
        --utf8_left_;
        utf8_min_ = 0x80;
        utf8_max_ = 0xbf;
        return true;
    }
    if (want_low_ && c != '\\')
        return false;
    if (c == '"') {
        end_string();
        return true;
    }
    if (c == '\\') {
        escaped_ = true;
        return true;
    }
    if (c < 0x20)
        return false;  // control characters must be escaped
    if (c < 0x80)
        return true;
    // The first byte fixes how many follow and, against overlong forms, surrogates and
    // code points past U+10FFFF, the range of the second (RFC 3629 section 4).
    if (c >= 0xc2 && c <= 0xdf) {
        utf8_left_ = 1;
    } else if (c >= 0xe0 && c <= 0xef) {
        utf8_left_ = 2;
        if (c == 0xe0)
            utf8_min_ = 0xa0;
        else if (c == 0xed)
            utf8_max_ = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        utf8_left_ = 3;
        if (c == 0xf0)
            utf8_min_ = 0x90;
        else if (c == 0xf4)
            utf8_max_ = 0x8f;
    } else {
        return false;
    }
    return true;
}

bool ResponseScanner::escape_byte(uint8_t c)
{
    if (hex_left_ > 0) {
        const int digit = hex_value(c);
        if (digit < 0)
            return false;
        unit_ = unit_ * 16 + static_cast<uint32_t>(digit);
        if (--hex_left_ > 0)
            return true;
        escaped_ = false;
        const bool high = unit_ >= 0xd800 && unit_ <= 0xdbff;
        const bool low = unit_ >= 0xdc00 && unit_ <= 0xdfff;
        if (want_low_) {
            want_low_ = false;
            return low;
        }
        want_low_ = high;
        return !low;
    }
    if (c == 'u') {
        hex_left_ = 4;
        unit_ = 0;
        return true;
    }
    if (want_low_)
        return false;
    escaped_ = false;
    return c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't';
}

bool ResponseScanner::number_byte(char c, bool& consumed)
{
    consumed = true;
    if (is_digit(c)) {
        switch (number_state_) {
        case n_zero:
            return false;  // no leading zeros
        case n_minus:
            number_state_ = c == '0' ? n_zero : n_int;
            return true;
        case n_point:
            number_state_ = n_frac;
            return true;
        case n_e:
        case n_e_sign:
            number_state_ = n_exp;
            return true;
        default:
            return true;
        }
    }
    if (c == '.' && (number_state_ == n_zero || number_state_ == n_int)) {
        number_state_ = n_point;
        return true;
    }
    if ((c == 'e' || c == 'E') && (number_state_ == n_zero || number_state_ == n_int || number_state_ == n_frac)) {
        number_state_ = n_e;
        return true;
    }
    if ((c == '+' || c == '-') && number_state_ == n_e) {
        number_state_ = n_e_sign;
        return true;
    }
    consumed = false;
    return number_may_end(number_state_);
}

void ResponseScanner::end_string()
{
    token_ = Token::none;
    if (!is_key_) {
        end_value();
        return;
    }
    expect_ = Expect::colon;
    if (!capturing_key_)
        return;
    capturing_key_ = false;
    if (key_.size() > max_key_bytes)
        return;
    const nlohmann::json name = nlohmann::json::parse(key_, nullptr, false);
    value_is_id_ = name == "id";
    if (name == "event")
        summary_.is_event = true;
    key_flag_ = name == "timed_out" ? Flag::timed_out : name == "cancelled" ? Flag::cancelled : Flag::none;
}

void ResponseScanner::end_value()
{
    if (value_flag_ != Flag::none)
        set_flag(std::exchange(value_flag_, Flag::none), token_ == Token::literal && literal_ == "true");
    token_ = Token::none;
    expect_ = Expect::comma_or_close;
    if (!capturing_id_)
        return;
    capturing_id_ = false;
    // Not parsed: too long, or a number beyond a double's range (1e999), which no request
    // id can be (the request parser refuses it).
    const nlohmann::json id = id_text_.size() <= max_id_bytes ? nlohmann::json::parse(id_text_, nullptr, false)
                                                             : nlohmann::json(nlohmann::json::value_t::discarded);
    if (id.is_discarded())
        summary_.id.reset();
    else
        summary_.id = id.dump();
}

void ResponseScanner::capture(std::string_view bytes)
{
    // One byte past the limit marks the text as too long.
    std::string* text = capturing_key_ ? &key_ : capturing_id_ ? &id_text_ : nullptr;
    const size_t limit = capturing_key_ ? max_key_bytes : max_id_bytes;
    if (text && text->size() <= limit)
        text->append(bytes.substr(0, limit + 1 - text->size()));
}

void ResponseScanner::set_flag(Flag flag, bool value)
{
    if (flag == Flag::timed_out)
        summary_.timed_out = value;
    else if (flag == Flag::cancelled)
        summary_.cancelled = value;
}

std::optional<ResponseSummary> summarize_response(std::string_view line)
{
    ResponseScanner scanner;
    scanner.feed(line);
    return scanner.finish();
}

} // namespace agentvm
