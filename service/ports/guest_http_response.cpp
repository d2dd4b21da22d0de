#include "service/ports/guest_http_response.hpp"

#include <strings.h>

#include <algorithm>

#include <fmt/format.h>

namespace agentvm {

namespace {

GuestHttpResponse& self(http_parser* parser)
{
    return *static_cast<GuestHttpResponse*>(parser->data);
}

bool has_control_character(std::string_view text)
{
    return std::any_of(text.begin(), text.end(), [](char c) {
        const auto byte = static_cast<unsigned char>(c);
        return (byte < 0x20 && byte != '\t') || byte == 0x7f;
    });
}

} // namespace

GuestHttpResponse::GuestHttpResponse(bool head_request, Handlers handlers)
    : head_request_(head_request), handlers_(std::move(handlers))
{
    http_parser_init(&parser_, HTTP_RESPONSE);
    parser_.data = this;
    http_parser_settings_init(&settings_);
    settings_.on_status = &GuestHttpResponse::on_status;
    settings_.on_header_field = &GuestHttpResponse::on_field;
    settings_.on_header_value = &GuestHttpResponse::on_value;
    settings_.on_headers_complete = &GuestHttpResponse::on_headers_complete;
    settings_.on_body = &GuestHttpResponse::on_body;
    settings_.on_message_complete = &GuestHttpResponse::on_message_complete;
}

std::optional<std::string> GuestHttpResponse::feed(std::string_view bytes)
{
    if (ended_ || error_)
        return error_;
    const size_t parsed = http_parser_execute(&parser_, &settings_, bytes.data(), bytes.size());
    if (error_)
        return error_;
    if (ended_) {
        // A 101's rest is the new protocol's; anything after a whole answer is not wanted
        // (the request asked for "Connection: close").
        if (head_.upgrade)
            upgraded_.assign(bytes.substr(std::min(parsed, bytes.size())));
        return std::nullopt;
    }
    if (bytes.empty())
        return head_seen_ ? "the server in the guest closed the connection before its answer ended"
                          : "the server in the guest closed the connection without answering";
    const auto err = HTTP_PARSER_ERRNO(&parser_);
    if (err != HPE_OK)
        return fmt::format("the guest's answer is not HTTP/1.1 ({})", http_errno_description(err));
    return std::nullopt;
}

bool GuestHttpResponse::grow_head(size_t length)
{
    head_bytes_ += length;
    if (head_bytes_ > max_head_bytes) {
        error_ = fmt::format("the guest's answer has a head over {} bytes", max_head_bytes);
        return false;
    }
    return true;
}

int GuestHttpResponse::on_status(http_parser* parser, const char* /*at*/, size_t length)
{
    return self(parser).grow_head(length) ? 0 : 1;
}

int GuestHttpResponse::on_field(http_parser* parser, const char* at, size_t length)
{
    GuestHttpResponse& response = self(parser);
    if (!response.grow_head(length))
        return 1;
    if (response.in_value_ && !response.commit_field())
        return 1;
    response.field_.append(at, length);
    return 0;
}

bool GuestHttpResponse::commit_field()
{
    if (head_.headers.size() >= max_fields) {
        error_ = fmt::format("the guest's answer has over {} header fields", max_fields);
        return false;
    }
    head_.headers.emplace_back(std::move(field_), std::move(value_));
    field_.clear();
    value_.clear();
    in_value_ = false;
    return true;
}

int GuestHttpResponse::on_value(http_parser* parser, const char* at, size_t length)
{
    GuestHttpResponse& response = self(parser);
    if (!response.grow_head(length))
        return 1;
    response.in_value_ = true;
    response.value_.append(at, length);
    return 0;
}

int GuestHttpResponse::on_headers_complete(http_parser* parser)
{
    return self(parser).headers_complete();
}

int GuestHttpResponse::headers_complete()
{
    if (ended_)
        return 1;
    if ((in_value_ || !field_.empty()) && !commit_field())
        return 1;
    head_.status = parser_.status_code;
    // http-parser takes any one to three digits; MHD would send a status below 100 as it is.
    if (head_.status < 100 || head_.status > 599) {
        error_ = fmt::format("the guest's answer has status {}, not one from 100 to 599", head_.status);
        return 1;
    }
    if (head_.status >= 100 && head_.status < 200 && head_.status != 101) {
        // Interim (100 Continue, 103 Early Hints): the real answer follows. It has no body
        // (RFC 9110 15.2), whatever its fields say; 1 tells http_parser so.
        head_ = Head{};
        return 1;
    }
    HeaderList kept;
    for (auto& [name, value] : head_.headers) {
        if (name.empty() || has_control_character(name) || has_control_character(value)) {
            error_ = "the guest's answer has a header field with a control character in it";
            return 1;
        }
        if (::strcasecmp(name.c_str(), "Content-Type") == 0)
            head_.content_type = value;
        else if (::strcasecmp(name.c_str(), "Upgrade") == 0 && head_.status == 101)
            kept.emplace_back(std::move(name), std::move(value));  // the 101 must name it again
        else if (!hop_by_hop_header(name) && ::strcasecmp(name.c_str(), "Date") != 0)
            kept.emplace_back(std::move(name), std::move(value));
    }
    head_.headers = std::move(kept);
    head_.upgrade = head_.status == 101;
    // ULLONG_MAX: no Content-Length; a chunked body's is not one either (RFC 9112 6.3).
    if (parser_.content_length != ULLONG_MAX && (parser_.flags & F_CHUNKED) == 0 && !head_.upgrade)
        head_.content_length = parser_.content_length;
    head_seen_ = true;
    handlers_.on_head(head_);
    // 1 tells http_parser the answer has no body: a HEAD's, which still says Content-Length.
    return head_request_ && !head_.upgrade ? 1 : 0;
}

int GuestHttpResponse::on_body(http_parser* parser, const char* at, size_t length)
{
    GuestHttpResponse& response = self(parser);
    if (response.ended_ || !response.head_seen_)
        return 1;
    response.handlers_.on_body(std::string_view(at, length));
    return 0;
}

int GuestHttpResponse::on_message_complete(http_parser* parser)
{
    GuestHttpResponse& response = self(parser);
    if (!response.head_seen_)
        return 0;  // an interim answer ended
    if (response.ended_)
        return 1;
    response.ended_ = true;
    response.handlers_.on_end();
    // After a 101, http_parser stops by itself and counts what it parsed, the rest being the
    // new protocol's; after any other answer, what follows was not asked for: stop here.
    return response.head_.upgrade ? 0 : 1;
}

} // namespace agentvm
