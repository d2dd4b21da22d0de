#include "service/fusion/fusion_job.hpp"

#include <cmath>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "common/base64.hpp"
#include "service/problem.hpp"

namespace agentvm {
namespace {

std::string in_work_dir(const std::string& path)
{
    return path.starts_with('/') ? path : std::string(fusion_work_dir) + "/" + path;
}

std::string error_message(const Json& answer)
{
    const std::string why =
        answer.contains("error") && answer["error"].is_object() ? answer["error"].value("message", "") : "";
    return why + output_of(answer, "stderr");
}

} // namespace

std::string output_of(const Json& answer, const char* stream, size_t max_bytes)
{
    try {
        std::string bytes = get_bytes(answer, stream).value_or("");
        if (bytes.size() > max_bytes)
            bytes.resize(max_bytes);
        return bytes;
    } catch (const CallError&) {
        return "";
    }
}

std::optional<std::string> FetchBudget::refuse(const std::string& path, const Json& stat_answer) const
{
    const Json type = stat_answer.value("type", Json(nullptr));
    if (type != "file")
        return fmt::format("fetching {}: not a regular file ({})", path,
                           type.is_string() ? type.get<std::string>() : "of no type");
    const Json size = stat_answer.value("size", Json(nullptr));
    if (!size.is_number_integer() || (!size.is_number_unsigned() && size.get<int64_t>() < 0))
        return fmt::format("fetching {}: the sandbox gave no size for it", path);
    if (size.get<uint64_t>() > left_)
        return over(path);
    return std::nullopt;
}

bool FetchBudget::take(std::string& content, std::string_view bytes)
{
    if (bytes.size() > left_)
        return false;
    left_ -= bytes.size();
    content.append(bytes);
    return true;
}

std::string FetchBudget::over(const std::string& path) const
{
    return fmt::format("fetching {}: the files fetched would pass {} bytes, the most one request brings back "
                       "(--fusion-fetch-max)",
                       path, max_);
}

Json fusion_body(const std::string& text)
{
    Json body = Json::parse(text, nullptr, false);
    if (!body.is_object())
        throw RefusedRequest(ServiceError::bad_json, "the body must be a JSON object");
    return body;
}

double fusion_number(const Json& body, const char* name, double fallback, double min, double max)
{
    if (!body.contains(name) || body[name].is_null())
        return fallback;
    const Json& value = body[name];
    if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < min
        || value.get<double>() > max)
        throw_bad_field(fmt::format("\"{}\" must be a number from {} to {}", name, min, max));
    return value.get<double>();
}

FusionFiles parse_fusion_files(const Json& body)
{
    FusionFiles parsed;
    if (body.contains("files") && !body["files"].is_null()) {
        if (!body["files"].is_object())
            throw_bad_field("\"files\" must be an object of path -> base64 content");
        for (const auto& [path, content] : body["files"].items()) {
            if (content.is_null())
                continue;
            if (path.empty() || path.find('\0') != std::string::npos || !content.is_string())
                throw_bad_field(fmt::format("\"files\": \"{:.64}\" must be a path with base64 content", path));
            auto bytes = base64_decode(content.get<std::string>());
            if (!bytes)
                throw_bad_field(fmt::format("\"files\": the content of \"{:.64}\" is not base64", path));
            parsed.files.emplace_back(path, std::move(*bytes));
        }
    }
    if (body.contains("fetch_files") && !body["fetch_files"].is_null()) {
        if (!body["fetch_files"].is_array())
            throw_bad_field("\"fetch_files\" must be an array of paths");
        for (const Json& path : body["fetch_files"]) {
            if (!path.is_string() || path.get<std::string>().empty())
                throw_bad_field("\"fetch_files\" must be an array of non-empty paths");
            parsed.fetch_files.push_back(path.get<std::string>());
        }
    }
    return parsed;
}

FusionJob::FusionJob(SandboxManager& manager, std::shared_ptr<HttpExchange> exchange, FusionFiles files)
    : manager_(manager), exchange_(std::move(exchange)), files_(std::move(files)),
      fetch_budget_(manager_.config().fusion_fetch_max)
{
}

void FusionJob::start(double lifetime_s, Json metadata)
{
    auto self = shared_from_this();
    Sandbox::Settings settings;
    settings.timeout = std::chrono::seconds(static_cast<int64_t>(std::ceil(lifetime_s)));
    settings.metadata = std::move(metadata);
    manager_.create(manager_.default_pool(), std::move(settings), [self](Sandbox* sandbox, const Refusal* refusal) {
        if (refusal)
            return self->exchange_->refuse(*refusal);
        self->sandbox_ = self->manager_.find(sandbox->id());
        self->sandbox_id_ = sandbox->id();
        self->make_dirs();
    });
}

void FusionJob::make_dirs()
{
    std::set<std::string> dirs{fusion_work_dir};
    for (const auto& [path, bytes] : files_.files) {
        const std::string parent = std::filesystem::path(in_work_dir(path)).parent_path().string();
        if (!parent.empty())
            dirs.insert(parent);
    }
    Json argv = Json::array({"mkdir", "-p", "--"});
    for (const std::string& dir : dirs)
        argv.push_back(dir);
    auto self = shared_from_this();
    send(Json{{"op", "exec"}, {"argv", argv}}, [self](Json&& answer) {
        if (answer.contains("error") || answer.value("exit_code", 1) != 0)
            return self->sandbox_error("making the work directory failed: " + error_message(answer));
        self->write_files();
        self->run();
    });
}

void FusionJob::write_files()
{
    // write_file is handled in order before the calls that follow it on the connection, so
    // the job's run may be sent at once.
    auto self = shared_from_this();
    for (const auto& file : files_.files) {
        const std::string& path = file.first;
        Json request{{"op", "write_file"}, {"path", in_work_dir(path)}};
        put_bytes(request, "data", file.second);
        send(std::move(request), [self, path](Json&& answer) {
            if (answer.contains("error"))
                self->write_failed_ = "writing " + path + ": " + error_message(answer);
        });
    }
}

void FusionJob::done(const char* status)
{
    if (!write_failed_.empty())
        return sandbox_error(write_failed_);
    fetch_next(0, status);
}

void FusionJob::fetch_next(size_t index, const char* status)
{
    if (index == files_.fetch_files.size())
        return respond(status, "");
    // A stat first (it follows links, as read_file would): a link to /dev/zero, a FIFO (whose
    // read would hold the agent's connection) or a sparse file of a TiB is refused before
    // the agent reads a byte of it.
    auto self = shared_from_this();
    const std::string path = files_.fetch_files[index];
    auto sandbox = sandbox_.lock();
    if (!sandbox || sandbox->stopping())
        return sandbox_error("the sandbox ended before its files were fetched");
    const CallHandlers handlers{[](Json&&) {}, [self, path, index, status](Json&& answer) {
        if (answer.contains("error") && answer["error"].is_object()
            && answer["error"].value("code", "") == "vm_died")
            return self->sandbox_error("the sandbox ended while its files were fetched: " + error_message(answer));
        // A file the run did not leave is left out, as SandboxFusion does.
        if (answer.contains("error"))
            return self->fetch_next(index + 1, status);
        if (auto why = self->fetch_budget_.refuse(path, answer))
            return self->sandbox_error(*why);
        self->read_next(index, status);
    }};
    sandbox->call(Json{{"op", "stat"}, {"path", in_work_dir(path)}}, std::nullopt, handlers);
}

void FusionJob::read_next(size_t index, const char* status)
{
    auto self = shared_from_this();
    const std::string path = files_.fetch_files[index];
    auto content = std::make_shared<std::string>();
    auto over = std::make_shared<bool>(false);
    CallHandlers handlers;
    handlers.on_event = [self, path, content, over](Json&& event) {
        if (*over)
            return;
        try {
            const std::string bytes = get_bytes(event, "data").value_or("");
            if (!self->fetch_budget_.take(*content, bytes)) {
                // Answered now: the sandbox is deleted with the answer, which ends the read.
                *over = true;
                content->clear();
                self->sandbox_error(self->fetch_budget_.over(path));
            }
        } catch (const CallError&) {
        }
    };
    handlers.on_answer = [self, path, content, over, index, status](Json&& answer) {
        if (*over)
            return;
        // The sandbox ended: the next read_file would go to an episode that is gone (sent
        // from inside its exit, after its calls were failed) and never be answered.
        if (answer.contains("error") && answer["error"].is_object()
            && answer["error"].value("code", "") == "vm_died")
            return self->sandbox_error("the sandbox ended while its files were fetched: " + error_message(answer));
        // A file the run did not leave is left out, as SandboxFusion does.
        if (!answer.contains("error"))
            self->fetched_[path] = base64_encode(*content);
        self->fetch_next(index + 1, status);
    };
    auto sandbox = sandbox_.lock();
    if (!sandbox || sandbox->stopping())
        return sandbox_error("the sandbox ended before its files were fetched");
    sandbox->call(Json{{"op", "read_file"}, {"path", in_work_dir(path)}}, std::nullopt, std::move(handlers));
}

void FusionJob::sandbox_error(const std::string& message)
{
    respond("SandboxError", message);
}

void FusionJob::respond(const char* status, const std::string& message)
{
    if (answered_)
        return;
    answered_ = true;
    Json answer{{"status", status}, {"message", message}};
    describe(answer);
    Json files = Json::object();
    for (const auto& [path, content] : fetched_)
        files[path] = content;
    answer["executor_pod_name"] = sandbox_id_.empty() ? Json(nullptr) : Json(sandbox_id_);
    answer["files"] = std::move(files);
    exchange_->respond(200, answer.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n");
    if (auto sandbox = manager_.find(sandbox_id_))
        manager_.remove(*sandbox, "done");
}

void FusionJob::send(Json request, std::function<void(Json&&)> on_answer)
{
    if (auto sandbox = sandbox_.lock())
        sandbox->call(std::move(request), std::nullopt, CallHandlers{[](Json&&) {}, std::move(on_answer)});
}

} // namespace agentvm
