#include "service/file_transfer.hpp"

#include <fmt/format.h>

#include "common/base64.hpp"
#include "service/call_relay.hpp"

namespace agentvm {
namespace {

// 4 MiB of file per write_file line (docs/protocol.md suggests it), two lines in flight.
constexpr size_t chunk_bytes = size_t{4} << 20;
constexpr unsigned chunks_in_flight = 2;

class Upload : public std::enable_shared_from_this<Upload> {
public:
    Upload(std::shared_ptr<Sandbox> sandbox, std::shared_ptr<HttpExchange> exchange, std::string path,
           std::optional<std::string> mode)
        : sandbox_(std::move(sandbox)), exchange_(std::move(exchange)), path_(std::move(path)),
          mode_(std::move(mode))
    {
    }

    ~Upload()
    {
        if (auto sandbox = sandbox_.lock(); sandbox && claimed_)
            sandbox->release_upload(path_);
    }

    void start()
    {
        if (!sandbox_.lock()->claim_upload(path_))
            return exchange_->refuse(ServiceError::upload_in_progress,
                                     fmt::format("{} is being uploaded already; wait for that upload to end", path_));
        claimed_ = true;
        Json summary{{"op", "write_file"}, {"path", path_}};
        if (mode_)
            summary["mode"] = *mode_;
        seq_ = sandbox_.lock()->record(std::move(summary));
        auto self = shared_from_this();
        exchange_->read_body([self](std::string_view piece) { self->take(piece); }, [self] { self->body_ended(); });
        exchange_->on_gone([self] { self->client_gone(); });
    }

private:
    void take(std::string_view piece)
    {
        if (failed_)
            return;
        buffer_.append(piece);
        while (buffer_.size() >= chunk_bytes && !failed_)
            send(chunk_bytes);
        if (in_flight_ >= chunks_in_flight)
            exchange_->pause_body();
    }

    void body_ended()
    {
        ended_ = true;
        if (failed_)
            return;
        if (!buffer_.empty() || !sent_any_)
            send(buffer_.size());
        finish_if_done();
    }

    void send(size_t bytes)
    {
        // The sandbox may have ended between chunks (no chunk in flight to be failed): a
        // chunk sent now would never be answered, nor would the upload.
        if (auto sandbox = sandbox_.lock(); !sandbox || sandbox->stopping()) {
            failed_ = true;
            const Json answer{{"error", {{"code", "vm_died"}, {"message", "the sandbox ended during the upload"}}}};
            if (sandbox)
                sandbox->record_end(seq_, answer);
            return respond_agent_error(*exchange_, answer);
        }
        Json request{{"op", "write_file"},
                     {"path", path_},
                     {"data_b64", base64_encode(std::string_view(buffer_).substr(0, bytes))}};
        if (sent_any_)
            request["append"] = true;
        else if (mode_)
            request["mode"] = *mode_;
        buffer_.erase(0, bytes);
        sent_any_ = true;
        total_ += bytes;
        ++in_flight_;
        auto self = shared_from_this();
        auto on_answer = [self](Json&& answer) { self->answered(answer); };
        if (auto sandbox = sandbox_.lock())
            sandbox->call(std::move(request), std::nullopt,
                          answering(exchange_, CallHandlers{[](Json&&) {}, std::move(on_answer)}));
    }

    void answered(const Json& answer)
    {
        --in_flight_;
        if (failed_)
            return;
        if (answer.contains("error")) {
            failed_ = true;
            if (auto sandbox = sandbox_.lock())
                sandbox->record_end(seq_, answer);
            respond_agent_error(*exchange_, answer);
            return;
        }
        if (!ended_ && in_flight_ < chunks_in_flight)
            exchange_->resume_body();
        finish_if_done();
    }

    // The client went away before its answer: the upload stops where it is, and its history
    // entry says so instead of running forever.
    void client_gone()
    {
        if (failed_)
            return;
        failed_ = true;
        if (auto sandbox = sandbox_.lock())
            sandbox->record_end(seq_, Json{{"error",
                                            {{"code", "client_gone"},
                                             {"message", fmt::format("the client went away after {} bytes of the "
                                                                     "upload had been sent to the sandbox",
                                                                     total_)}}}});
    }

    void finish_if_done()
    {
        if (!ended_ || in_flight_ > 0 || failed_ || exchange_->answered())
            return;
        const Json result{{"ok", true}, {"path", path_}, {"bytes", total_}};
        if (auto sandbox = sandbox_.lock())
            sandbox->record_end(seq_, result);
        exchange_->respond(200, result.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n");
    }

    std::weak_ptr<Sandbox> sandbox_;  // weak: its pending calls hold this upload
    std::shared_ptr<HttpExchange> exchange_;
    std::string path_;
    std::optional<std::string> mode_;
    std::string buffer_;
    uint64_t seq_ = 0;
    uint64_t total_ = 0;
    unsigned in_flight_ = 0;
    bool sent_any_ = false;
    bool ended_ = false;
    bool failed_ = false;
    bool claimed_ = false;
};

} // namespace

void start_upload(const std::shared_ptr<Sandbox>& sandbox, const std::shared_ptr<HttpExchange>& exchange,
                  const std::string& path, std::optional<std::string> mode)
{
    std::make_shared<Upload>(sandbox, exchange, path, std::move(mode))->start();
}

void start_download(const std::shared_ptr<Sandbox>& sandbox, const std::shared_ptr<HttpExchange>& exchange,
                    const std::string& path)
{
    auto pacer = std::make_shared<StreamPacer>(sandbox, exchange);
    auto started = std::make_shared<bool>(false);
    CallHandlers handlers;
    handlers.on_event = [exchange, pacer, started](Json&& event) {
        std::optional<std::string> bytes;
        try {
            bytes = get_bytes(event, "data");
        } catch (const CallError&) {
        }
        if (!bytes)
            return;
        if (!*started) {
            *started = true;
            exchange->start_stream(200, "application/octet-stream");
        }
        exchange->write(*bytes);
        pacer->after_write();
    };
    handlers.on_answer = [exchange, pacer, started](Json&& answer) {
        pacer->release();
        if (answer.contains("error")) {
            if (*started)
                exchange->abort();  // the client sees a body cut short, never a short file
            else
                respond_agent_error(*exchange, answer);
            return;
        }
        if (*started)
            exchange->finish();
        else
            exchange->respond(200, "", "application/octet-stream");
    };
    const Json request{{"op", "read_file"}, {"path", path}};
    const uint64_t call = sandbox->call(request, request, answering(exchange, std::move(handlers)));
    forget_call_when_gone(*exchange, sandbox, call, std::move(pacer));
}

} // namespace agentvm
