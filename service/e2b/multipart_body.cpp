#include "service/e2b/multipart_body.hpp"

#include <strings.h>

#include <microhttpd.h>

#include <utility>

namespace agentvm {
namespace {

// MHD's parse buffer: a part's headers must fit in it, and the boundary twice over.
constexpr size_t parse_buffer_bytes = 64 * 1024;

} // namespace

// MHD calls a C function: an exception a handler throws must not cross it, so it is kept and
// thrown again once MHD has returned (feed).
struct MultipartBody::Callback {
    static MHD_Result iterate(void* cls, MHD_ValueKind /*kind*/, const char* key, const char* filename,
                              const char* content_type, const char* /*transfer_encoding*/, const char* data,
                              uint64_t off, size_t size)
    {
        auto* body = static_cast<MultipartBody*>(cls);
        try {
            return body->take(key, filename, content_type, data, off, size) ? MHD_YES : MHD_NO;
        } catch (...) {
            body->thrown_ = std::current_exception();
            return MHD_NO;
        }
    }
};

std::unique_ptr<MultipartBody> MultipartBody::open(HttpExchange& exchange, Handlers handlers)
{
    // MHD's post processor also takes application/x-www-form-urlencoded, which carries no file.
    const std::optional<std::string> type = exchange.header("Content-Type");
    constexpr std::string_view form_data = "multipart/form-data";
    if (!type || strncasecmp(type->c_str(), form_data.data(), form_data.size()) != 0)
        return nullptr;
    MHD_Connection* connection = exchange.mhd_connection();
    if (!connection)
        return nullptr;
    // Heap-held and never moved: MHD keeps the pointer to it as its callback's closure.
    std::unique_ptr<MultipartBody> body(new MultipartBody(std::move(handlers)));
    body->processor_ =
        MHD_create_post_processor(connection, parse_buffer_bytes, &Callback::iterate, body.get());
    if (!body->processor_)
        return nullptr;
    return body;
}

MultipartBody::~MultipartBody()
{
    if (processor_)
        MHD_destroy_post_processor(processor_);
}

bool MultipartBody::take(const char* name, const char* filename, const char* content_type, const char* data,
                         uint64_t offset, size_t size)
{
    const std::string_view key = name ? name : "";
    const bool same_names = in_part_ && key == part_.name
                            && (filename ? part_.filename && *part_.filename == filename : !part_.filename);
    if (offset == 0 && (!in_part_ || part_bytes_ > 0 || !same_names)) {
        part_ = Part{std::string(key), filename ? std::optional<std::string>(filename) : std::nullopt,
                     content_type ? std::optional<std::string>(content_type) : std::nullopt};
        in_part_ = true;
        part_bytes_ = 0;
        ++parts_;
        if (handlers_.on_part)
            handlers_.on_part(part_);
    }
    if (size > 0) {
        part_bytes_ += size;
        if (handlers_.on_data)
            handlers_.on_data(std::string_view(data, size));
    }
    return true;
}

bool MultipartBody::feed(std::string_view piece)
{
    if (malformed_ || !processor_)
        return false;
    const bool parsed = MHD_post_process(processor_, piece.data(), piece.size()) == MHD_YES;
    malformed_ = !parsed;
    if (thrown_)
        std::rethrow_exception(std::exchange(thrown_, nullptr));
    return parsed;
}

bool MultipartBody::finish()
{
    if (!processor_)
        return false;
    // MHD's verdict: the body stopped at its closing boundary (or before any boundary at all).
    const bool whole = MHD_destroy_post_processor(processor_) == MHD_YES;
    processor_ = nullptr;
    return whole && !malformed_;
}

} // namespace agentvm
