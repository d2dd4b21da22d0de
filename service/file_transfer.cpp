#include "service/file_transfer.hpp"

#include "service/call_relay.hpp"
#include "service/file_reader.hpp"
#include "service/file_writer.hpp"

namespace agentvm {
void start_upload(const std::shared_ptr<Sandbox>& sandbox, const std::shared_ptr<HttpExchange>& exchange,
                  const std::string& path, std::optional<std::string> mode)
{
    FileWriter::Handlers handlers;
    handlers.on_room = [weak = std::weak_ptr<HttpExchange>(exchange)] {
        if (auto held = weak.lock())
            guard_request(*held, [&] { held->resume_body(); });
    };
    handlers.on_done = [exchange](Json&& outcome) {
        guard_request(*exchange, [&] {
            if (outcome.contains("error"))
                return respond_agent_error(*exchange, outcome);
            exchange->respond(200, outcome.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n");
        });
    };
    std::optional<Refusal> refusal;
    std::shared_ptr<FileWriter> writer = FileWriter::open(sandbox, path, std::move(mode), std::move(handlers), refusal);
    if (!writer)
        return exchange->refuse(*refusal);
    exchange->read_body(
        [writer, exchange](std::string_view piece) {
            writer->write(piece);
            if (!writer->has_room())
                exchange->pause_body();
        },
        [writer] { writer->close(); });
    exchange->on_gone([writer] { writer->abandon("the client went away"); });
}

void start_download(const std::shared_ptr<Sandbox>& sandbox, const std::shared_ptr<HttpExchange>& exchange,
                    const std::string& path, const std::optional<std::string>& user)
{
    auto pacer = std::make_shared<StreamPacer>(sandbox, exchange);
    auto started = std::make_shared<bool>(false);
    FileReaderHandlers handlers;
    handlers.on_data = [exchange, pacer, started](std::string&& bytes) {
        guard_request(*exchange, [&] {
            if (!*started) {
                *started = true;
                exchange->start_stream(200, "application/octet-stream");
            }
            exchange->write(bytes);
            pacer->after_write();
        });
    };
    handlers.on_done = [exchange, pacer, started](Json&& answer) {
        guard_request(*exchange, [&] {
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
        });
    };
    const uint64_t call = read_file_stream(sandbox, path, std::move(handlers), user);
    forget_call_when_gone(*exchange, sandbox, call, std::move(pacer));
}

} // namespace agentvm
