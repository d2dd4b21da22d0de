// Reads the answer of a server inside the guest, through http_parser (nodejs/http-parser,
// packaged by Debian: README, "Dependencies"), which delimits its body however it is framed
// (Content-Length, chunked, or the end of the connection) so that serve can pass it on to
// the client in MHD's own framing. The guest is hostile: the head is bounded in size and in
// fields, a field with a control character in it fails the answer, and interim 1xx answers
// other than 101 are passed over.
#pragma once

#include <http_parser.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "service/ports/guest_request_head.hpp"

namespace agentvm {

class GuestHttpResponse {
public:
    static constexpr size_t max_head_bytes = 64 * 1024;
    static constexpr size_t max_fields = 128;

    struct Head {
        int status = 0;
        HeaderList headers;  // hop-by-hop fields left out
        std::string content_type;
        std::optional<uint64_t> content_length;  // when the body is framed by one
        bool upgrade = false;  // 101 Switching Protocols: what follows is the new protocol's
    };
    struct Handlers {
        // Returns false when the client's request was HEAD: the answer then has no body.
        std::function<void(const Head&)> on_head;
        std::function<void(std::string_view)> on_body;
        std::function<void()> on_end;
    };

    GuestHttpResponse(bool head_request, Handlers handlers);
    GuestHttpResponse(const GuestHttpResponse&) = delete;
    GuestHttpResponse& operator=(const GuestHttpResponse&) = delete;

    // Feeds what came from the guest; an empty piece is the end of the connection. Returns
    // an error naming what is wrong with the answer, or nothing. After an upgrade head the
    // bytes not parsed are in take_upgraded().
    std::optional<std::string> feed(std::string_view bytes);
    bool head_seen() const { return head_seen_; }
    bool ended() const { return ended_; }
    std::string take_upgraded() { return std::move(upgraded_); }

private:
    static int on_status(http_parser* parser, const char* at, size_t length);
    static int on_field(http_parser* parser, const char* at, size_t length);
    static int on_value(http_parser* parser, const char* at, size_t length);
    static int on_headers_complete(http_parser* parser);
    static int on_body(http_parser* parser, const char* at, size_t length);
    static int on_message_complete(http_parser* parser);
    int headers_complete();
    bool grow_head(size_t length);
    // The field read so far into the head; false (and error_ set) past max_fields.
    bool commit_field();

    http_parser parser_{};
    http_parser_settings settings_{};
    bool head_request_;
    Handlers handlers_;
    Head head_;
    std::string field_;
    std::string value_;
    bool in_value_ = false;
    size_t head_bytes_ = 0;
    bool head_seen_ = false;
    bool ended_ = false;
    std::optional<std::string> error_;
    std::string upgraded_;
};

} // namespace agentvm
