// A multipart/form-data request body (RFC 7578) read as it streams in, through libmicrohttpd's
// post processor rather than a parser of our own: each part's start (its field name, file name
// and type) and then its bytes, piece by piece, so a part is never held whole.
//
// MHD reports no part's end and may report a part's start twice (once empty, then with its
// first bytes); a part starts here when MHD reports offset 0 for a field or file name other
// than the current part's, or after the current part has had bytes. Two consecutive empty
// parts of one field and file name are therefore one part.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "service/http_server.hpp"

struct MHD_PostProcessor;

namespace agentvm {

class MultipartBody {
public:
    struct Part {
        std::string name;                     // the form field's name
        std::optional<std::string> filename;  // as the part's Content-Disposition gives it
        std::optional<std::string> content_type;
    };
    struct Handlers {
        // A part begins; the previous one, if any, has ended.
        std::function<void(const Part& part)> on_part;
        // The current part's next bytes (valid during the call).
        std::function<void(std::string_view bytes)> on_data;
    };

    // A parser of `exchange`'s body, or nullptr when its Content-Type is not
    // multipart/form-data with a usable boundary. Made while the request runs.
    static std::unique_ptr<MultipartBody> open(HttpExchange& exchange, Handlers handlers);
    ~MultipartBody();
    MultipartBody(const MultipartBody&) = delete;
    MultipartBody& operator=(const MultipartBody&) = delete;

    // The body's next piece; false once the body is malformed (the rest is then ignored).
    bool feed(std::string_view piece);
    // The body has ended: true when it ended well-formed, after its closing boundary or
    // without any part at all (count the parts to tell).
    bool finish();
    unsigned parts() const { return parts_; }

private:
    explicit MultipartBody(Handlers handlers) : handlers_(std::move(handlers)) {}
    struct Callback;  // MHD's C callback, a friend
    bool take(const char* name, const char* filename, const char* content_type, const char* data, uint64_t offset,
              size_t size);

    Handlers handlers_;
    MHD_PostProcessor* processor_ = nullptr;
    bool malformed_ = false;
    std::exception_ptr thrown_;  // by a handler, inside MHD's callback: thrown again after it
    bool in_part_ = false;
    uint64_t part_bytes_ = 0;
    Part part_;
    unsigned parts_ = 0;
};

} // namespace agentvm
