#include "service/file_writer.hpp"

#include <fmt/format.h>

#include "common/base64.hpp"

namespace agentvm {
namespace {

// 4 MiB of file per write_file line (docs/protocol.md suggests it), two lines in flight.
constexpr size_t chunk_bytes = size_t{4} << 20;
constexpr unsigned chunks_in_flight = 2;

} // namespace

std::shared_ptr<FileWriter> FileWriter::open(const std::shared_ptr<Sandbox>& sandbox, std::string path,
                                             std::optional<std::string> mode, Handlers handlers,
                                             std::optional<Refusal>& refusal, std::optional<std::string> user)
{
    if (!sandbox->claim_upload(path)) {
        refusal = Refusal{ServiceError::upload_in_progress,
                          fmt::format("{} is being uploaded already; wait for that upload to end", path),
                          std::nullopt};
        return nullptr;
    }
    Json summary{{"op", "write_file"}, {"path", path}};
    if (mode)
        summary["mode"] = *mode;
    if (user)
        summary["user"] = *user;
    auto writer = std::make_shared<FileWriter>(sandbox, std::move(path), std::move(mode), std::move(user),
                                               std::move(handlers));
    writer->seq_ = sandbox->record(std::move(summary));
    return writer;
}

FileWriter::FileWriter(std::weak_ptr<Sandbox> sandbox, std::string path, std::optional<std::string> mode,
                       std::optional<std::string> user, Handlers handlers)
    : sandbox_(std::move(sandbox)),
      path_(std::move(path)),
      mode_(std::move(mode)),
      user_(std::move(user)),
      handlers_(std::move(handlers))
{
}

FileWriter::~FileWriter()
{
    if (auto sandbox = sandbox_.lock())
        sandbox->release_upload(path_);
}

void FileWriter::write(std::string_view bytes)
{
    if (over_)
        return;
    buffer_.append(bytes);
    while (buffer_.size() >= chunk_bytes && !over_)
        send(chunk_bytes);
}

bool FileWriter::has_room() const
{
    return in_flight_ < chunks_in_flight;
}

void FileWriter::close()
{
    closed_ = true;
    if (over_)
        return;
    if (!buffer_.empty() || !sent_any_)
        send(buffer_.size());
    finish_if_done();
}

void FileWriter::abandon(const std::string& why)
{
    if (over_)
        return;
    over_ = true;
    if (auto sandbox = sandbox_.lock())
        sandbox->record_end(seq_, Json{{"error",
                                        {{"code", "client_gone"},
                                         {"message", fmt::format("{} after {} bytes of the upload had been sent "
                                                                 "to the sandbox",
                                                                 why, total_)}}}});
}

void FileWriter::send(size_t bytes)
{
    // The sandbox may have ended between chunks (no chunk in flight to be failed): a chunk
    // sent now would never be answered, nor would the file.
    auto sandbox = sandbox_.lock();
    if (!sandbox || sandbox->stopping())
        return fail(Json{{"error", {{"code", "vm_died"}, {"message", "the sandbox ended during the upload"}}}});
    Json request{{"op", "write_file"},
                 {"path", path_},
                 {"data_b64", base64_encode(std::string_view(buffer_).substr(0, bytes))}};
    if (user_)
        request["user"] = *user_;
    if (sent_any_)
        request["append"] = true;
    else if (mode_)
        request["mode"] = *mode_;
    buffer_.erase(0, bytes);
    sent_any_ = true;
    total_ += bytes;
    ++in_flight_;
    auto self = shared_from_this();
    sandbox->call(std::move(request), std::nullopt,
                  CallHandlers{[](Json&&) {}, [self](Json&& answer) { self->answered(answer); }});
}

void FileWriter::answered(const Json& answer)
{
    const bool was_full = !has_room();
    --in_flight_;
    if (over_)
        return;
    if (answer.contains("error"))
        return fail(answer);
    if (was_full && has_room() && !closed_ && handlers_.on_room)
        handlers_.on_room();
    finish_if_done();
}

void FileWriter::fail(Json answer)
{
    over_ = true;
    if (auto sandbox = sandbox_.lock())
        sandbox->record_end(seq_, answer);
    handlers_.on_done(std::move(answer));
}

void FileWriter::finish_if_done()
{
    if (!closed_ || in_flight_ > 0 || over_)
        return;
    over_ = true;
    Json result{{"ok", true}, {"path", path_}, {"bytes", total_}};
    if (auto sandbox = sandbox_.lock())
        sandbox->record_end(seq_, result);
    handlers_.on_done(std::move(result));
}

} // namespace agentvm
