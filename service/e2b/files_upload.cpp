#include "service/e2b/files_upload.hpp"

#include <strings.h>

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "protocol/utf8.hpp"
#include "service/call_relay.hpp"
#include "service/e2b/e2b_request.hpp"
#include "service/e2b/multipart_body.hpp"
#include "service/file_writer.hpp"
#include "service/native/native_wire.hpp"

namespace agentvm {
namespace {

// "/a/b/c.txt" -> "/a/b"; none for a file in "/" or in the agent's working directory.
std::optional<std::string> parent_dir(const std::string& path)
{
    const size_t slash = path.rfind('/');
    if (slash == std::string::npos || slash == 0)
        return std::nullopt;
    return path.substr(0, slash);
}

std::string base_name(const std::string& path)
{
    const size_t slash = path.rfind('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

class FilesUpload : public std::enable_shared_from_this<FilesUpload> {
public:
    FilesUpload(const std::shared_ptr<Sandbox>& sandbox, std::shared_ptr<HttpExchange> exchange,
                std::optional<std::string> path, std::optional<std::string> user)
        : sandbox_(sandbox), exchange_(std::move(exchange)), query_path_(std::move(path)), user_(std::move(user))
    {
    }

    void start();

private:
    void start_reading();
    struct File {
        std::string path;
        std::string pending;  // bytes that came before its writer was open
        std::shared_ptr<FileWriter> writer;
        bool ended = false;    // all its bytes have come
        bool written = false;  // and are in the guest
    };

    void on_part(const MultipartBody::Part& part);
    void begin_file(std::string path);
    void open_writer(const std::shared_ptr<File>& file);
    void on_data(std::string_view bytes);
    void end_file();
    void body_ended();
    void file_done(File& file, Json&& outcome);
    void answer_if_done();
    // Holds the body while a file has no writer yet or its writer has no room.
    void pace();
    void fail(ServiceError code, const std::string& message);
    void fail_agent(const Json& answer);
    void abandon_writers(const std::string& why);

    std::weak_ptr<Sandbox> sandbox_;
    std::shared_ptr<HttpExchange> exchange_;
    std::optional<std::string> query_path_;
    std::optional<std::string> user_;
    std::unique_ptr<MultipartBody> multipart_;
    std::vector<std::shared_ptr<File>> files_;
    bool skipping_ = false;  // the current part is not a "file" field: envd ignores those
    bool body_ended_ = false;
    bool paused_ = false;
    bool starting_ = false;  // within start(), the request's handler
    bool over_ = false;      // answered
};

void FilesUpload::start()
{
    starting_ = true;
    start_reading();
    starting_ = false;
}

void FilesUpload::start_reading()
{
    if (const std::optional<std::string> encoding = exchange_->header("Content-Encoding");
        encoding && strcasecmp(encoding->c_str(), "identity") != 0)
        return fail(ServiceError::bad_field,
                    fmt::format("Content-Encoding {}: agentvm takes uploads uncompressed (write without gzip)",
                                *encoding));
    const std::string type = media_type(exchange_->header("Content-Type").value_or(""));
    auto self = shared_from_this();
    exchange_->on_gone([self] { self->abandon_writers("the client went away"); });
    if (type == "application/octet-stream") {
        if (!query_path_)
            return fail(ServiceError::missing_field, "an application/octet-stream upload names its file by ?path=");
        exchange_->read_body(
            [self](std::string_view piece) {
                self->on_data(piece);
                self->pace();
            },
            [self] { self->body_ended(); });
        return begin_file(*query_path_);
    }
    if (!type.starts_with("multipart/"))
        return fail(ServiceError::bad_field,
                    fmt::format("unsupported Content-Type \"{}\": a file upload is multipart/form-data or "
                                "application/octet-stream",
                                type));
    std::weak_ptr<FilesUpload> weak = self;
    multipart_ = MultipartBody::open(*exchange_,
                                     MultipartBody::Handlers{[weak](const MultipartBody::Part& part) {
                                                                 if (auto held = weak.lock())
                                                                     held->on_part(part);
                                                             },
                                                             [weak](std::string_view bytes) {
                                                                 if (auto held = weak.lock())
                                                                     held->on_data(bytes);
                                                             }});
    if (!multipart_)
        return fail(ServiceError::bad_field,
                    "the body must be multipart/form-data with a boundary (Content-Type: multipart/form-data; "
                    "boundary=...)");
    exchange_->read_body(
        [self](std::string_view piece) {
            if (self->over_)
                return;
            if (!self->multipart_->feed(piece))
                return self->fail(ServiceError::bad_field, "the multipart/form-data body is malformed");
            self->pace();
        },
        [self] { self->body_ended(); });
}

void FilesUpload::on_part(const MultipartBody::Part& part)
{
    end_file();
    if (over_)
        return;
    skipping_ = part.name != "file";
    if (skipping_)
        return;
    if (query_path_) {
        if (!files_.empty())
            return fail(ServiceError::bad_field,
                        fmt::format("?path= names one file, {}, and the body holds more than one", *query_path_));
        return begin_file(*query_path_);
    }
    if (!part.filename || part.filename->empty())
        return fail(ServiceError::missing_field,
                    "a part named \"file\" has no filename: the filename is the path the file is written to");
    if (!is_valid_utf8(*part.filename))
        return fail(ServiceError::bad_field, "a part's filename (the file's path) must be UTF-8");
    begin_file(*part.filename);
}

void FilesUpload::begin_file(std::string path)
{
    if (path.ends_with('/'))
        return fail(ServiceError::bad_field, fmt::format("{} names a directory, not a file", path));
    for (const auto& file : files_)
        if (file->path == path)
            return fail(ServiceError::bad_field,
                        fmt::format("one request cannot upload two files to the same path '{}'", path));
    auto file = std::make_shared<File>();
    file->path = std::move(path);
    files_.push_back(file);
    const std::optional<std::string> parent = parent_dir(file->path);
    if (!parent)
        return open_writer(file);
    auto sandbox = sandbox_.lock();
    if (!sandbox || sandbox->stopping())
        return fail_agent(Json{{"error", {{"code", "vm_died"}, {"message", "the sandbox ended during the upload"}}}});
    Json request{{"op", "make_dir"}, {"path", *parent}};
    if (user_)
        request["user"] = *user_;
    std::weak_ptr<FilesUpload> weak = shared_from_this();
    auto on_answer = [weak, file](Json&& answer) {
        auto self = weak.lock();
        if (!self || self->over_)
            return;
        if (answer.contains("error"))
            return self->fail_agent(answer);
        self->open_writer(file);
    };
    sandbox->call(std::move(request), std::nullopt, answering(exchange_, CallHandlers{{}, std::move(on_answer)}));
}

void FilesUpload::open_writer(const std::shared_ptr<File>& file)
{
    auto sandbox = sandbox_.lock();
    if (!sandbox || sandbox->stopping())
        return fail_agent(Json{{"error", {{"code", "vm_died"}, {"message", "the sandbox ended during the upload"}}}});
    std::weak_ptr<FilesUpload> weak = shared_from_this();
    FileWriter::Handlers handlers;
    // Weak: the writer's calls hold it, and it must not hold the upload (nor the upload's
    // claim on the path) past the request.
    handlers.on_room = [weak] {
        if (auto self = weak.lock())
            guard_request(*self->exchange_, [&] { self->pace(); });
    };
    handlers.on_done = [weak, raw = file.get()](Json&& outcome) {
        if (auto self = weak.lock())
            guard_request(*self->exchange_, [&] { self->file_done(*raw, std::move(outcome)); });
    };
    std::optional<Refusal> refusal;
    file->writer = FileWriter::open(sandbox, file->path, std::nullopt, std::move(handlers), refusal, user_);
    if (!file->writer)
        return fail(refusal->code, refusal->message);
    if (!file->pending.empty())
        file->writer->write(std::exchange(file->pending, std::string()));
    if (file->ended)
        file->writer->close();
    pace();
}

void FilesUpload::on_data(std::string_view bytes)
{
    if (over_ || skipping_ || files_.empty() || files_.back()->ended)
        return;
    File& file = *files_.back();
    if (file.writer)
        file.writer->write(bytes);
    else
        file.pending.append(bytes);
}

void FilesUpload::end_file()
{
    if (files_.empty() || files_.back()->ended)
        return;
    File& file = *files_.back();
    file.ended = true;
    if (file.writer && !over_)
        file.writer->close();
}

void FilesUpload::body_ended()
{
    if (over_)
        return;
    if (multipart_) {
        if (!multipart_->finish())
            return fail(ServiceError::bad_field,
                        "the multipart/form-data body is malformed: it ended before its closing boundary");
        if (files_.empty())
            return fail(ServiceError::missing_field, "the body has no part named \"file\"");
    }
    end_file();
    body_ended_ = true;
    answer_if_done();
}

void FilesUpload::file_done(File& file, Json&& outcome)
{
    if (over_)
        return;
    if (outcome.contains("error"))
        return fail_agent(outcome);
    file.written = true;
    answer_if_done();
    pace();  // a closed writer says nothing when it has room again: its end does
}

void FilesUpload::answer_if_done()
{
    if (over_ || !body_ended_)
        return;
    for (const auto& file : files_)
        if (!file->written)
            return;
    over_ = true;
    Json written = Json::array();
    for (const auto& file : files_)
        written.push_back(Json{{"name", base_name(file->path)}, {"type", "file"}, {"path", file->path}});
    exchange_->respond(200, json_text(written));
}

void FilesUpload::pace()
{
    if (over_ || body_ended_)
        return;
    // The file the body is at waits for its writer; any writer without room (also one
    // finishing a file whose bytes have all come) holds the next bytes back.
    bool ready = true;
    for (const auto& file : files_)
        if (!file->written && (file->writer ? !file->writer->has_room() : !file->ended))
            ready = false;
    if (!ready && !paused_) {
        paused_ = true;
        exchange_->pause_body();
    } else if (ready && paused_) {
        paused_ = false;
        exchange_->resume_body();
    }
}

void FilesUpload::fail(ServiceError code, const std::string& message)
{
    if (over_)
        return;
    over_ = true;
    abandon_writers(message);
    if (starting_)
        return refuse_upload(exchange_, Refusal{code, message, std::nullopt});
    exchange_->refuse(code, message);
}

void FilesUpload::fail_agent(const Json& answer)
{
    if (over_)
        return;
    over_ = true;
    const Json error = answer.contains("error") ? answer["error"] : Json();
    abandon_writers(error.is_object() ? error.value("message", "the upload failed") : "the upload failed");
    respond_agent_error(*exchange_, answer);
}

void FilesUpload::abandon_writers(const std::string& why)
{
    for (const auto& file : files_)
        if (file->writer && !file->written)
            file->writer->abandon(why);
}

} // namespace

void refuse_upload(const std::shared_ptr<HttpExchange>& exchange, Refusal refusal)
{
    auto answer = [exchange, refusal = std::move(refusal)] {
        if (!exchange->answered())
            exchange->refuse(refusal);
    };
    exchange->read_body([answer](std::string_view) { answer(); }, answer);
}

void start_files_upload(const std::shared_ptr<Sandbox>& sandbox, const std::shared_ptr<HttpExchange>& exchange,
                        std::optional<std::string> path, std::optional<std::string> user)
{
    std::make_shared<FilesUpload>(sandbox, exchange, std::move(path), std::move(user))->start();
}

} // namespace agentvm
