#include "service/run_code.hpp"

#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>

#include "common/base64.hpp"
#include "service/api_error.hpp"
#include "service/create_request.hpp"

namespace agentvm {
namespace {

// Where the code and the request's files go; relative paths are relative to it.
constexpr const char* work_dir = "/tmp/run_code";
// What a run may last beyond its own timeouts before serve deletes the sandbox regardless.
constexpr int sandbox_slack_s = 60;

struct Language {
    const char* file;
    std::vector<std::string> command;
};

const std::map<std::string, Language>& languages()
{
    static const std::map<std::string, Language> known{
        {"python", {"main.py", {"python3", "main.py"}}},
        {"bash", {"main.sh", {"bash", "main.sh"}}},
    };
    return known;
}

struct FusionRequest {
    std::string code;
    std::string language;
    double run_timeout = 10;
    double memory_limit_mb = -1;
    std::optional<std::string> stdin_text;
    std::vector<std::pair<std::string, std::string>> files;  // path, bytes
    std::vector<std::string> fetch_files;
};

double number_field(const Json& body, const char* name, double fallback, double min, double max)
{
    if (!body.contains(name) || body[name].is_null())
        return fallback;
    const Json& value = body[name];
    if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < min
        || value.get<double>() > max)
        throw_bad_field(fmt::format("\"{}\" must be a number from {} to {}", name, min, max));
    return value.get<double>();
}

// SandboxFusion's /run_code request; fields it does not know are ignored, as it ignores them.
FusionRequest parse(const std::string& text)
{
    const Json body = Json::parse(text, nullptr, false);
    if (!body.is_object())
        throw ApiError(400, "bad_json", "the body must be a JSON object");
    FusionRequest request;
    if (!body.contains("code") || !body["code"].is_string())
        throw_bad_field("\"code\" (a string) is required");
    request.code = body["code"].get<std::string>();
    if (!body.contains("language") || !body["language"].is_string())
        throw_bad_field("\"language\" (a string) is required");
    request.language = body["language"].get<std::string>();
    number_field(body, "compile_timeout", 10, 0, max_sandbox_timeout_s);
    request.run_timeout = number_field(body, "run_timeout", 10, 0.001, max_sandbox_timeout_s);
    request.memory_limit_mb = number_field(body, "memory_limit_MB", -1, -1, 1 << 20);
    if (body.contains("stdin") && !body["stdin"].is_null()) {
        if (!body["stdin"].is_string())
            throw_bad_field("\"stdin\" must be a string");
        request.stdin_text = body["stdin"].get<std::string>();
    }
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
            request.files.emplace_back(path, std::move(*bytes));
        }
    }
    if (body.contains("fetch_files") && !body["fetch_files"].is_null()) {
        if (!body["fetch_files"].is_array())
            throw_bad_field("\"fetch_files\" must be an array of paths");
        for (const Json& path : body["fetch_files"]) {
            if (!path.is_string() || path.get<std::string>().empty())
                throw_bad_field("\"fetch_files\" must be an array of non-empty paths");
            request.fetch_files.push_back(path.get<std::string>());
        }
    }
    return request;
}

std::string in_work_dir(const std::string& path)
{
    return path.starts_with('/') ? path : std::string(work_dir) + "/" + path;
}

Json command_result(const Json& answer)
{
    std::string out;
    std::string err;
    try {
        out = get_bytes(answer, "stdout").value_or("");
        err = get_bytes(answer, "stderr").value_or("");
    } catch (const CallError&) {
    }
    const bool timed_out = answer.value("timed_out", false);
    Json code = nullptr;
    if (!timed_out) {
        if (answer.contains("exit_code") && answer["exit_code"].is_number())
            code = answer["exit_code"];
        else if (answer.contains("signal") && answer["signal"].is_number())
            code = -answer["signal"].get<int>();  // Python's returncode for a signal
    }
    return Json{{"status", timed_out ? "TimeLimitExceeded" : "Finished"},
                {"execution_time", answer.value("duration_ms", 0.0) / 1000.0},
                {"return_code", code},
                {"stdout", out},
                {"stderr", err}};
}

class RunCodeJob : public std::enable_shared_from_this<RunCodeJob> {
public:
    RunCodeJob(SandboxManager& manager, std::shared_ptr<HttpExchange> exchange, FusionRequest request)
        : manager_(manager), exchange_(std::move(exchange)), request_(std::move(request))
    {
    }

    void start()
    {
        auto self = shared_from_this();
        Sandbox::Settings settings;
        settings.timeout =
            std::chrono::seconds(static_cast<int64_t>(std::ceil(request_.run_timeout)) + sandbox_slack_s);
        settings.metadata = Json{{"run_code", request_.language}};
        manager_.create(manager_.default_pool(), std::move(settings), [self](Sandbox* sandbox, const Refusal* refusal) {
            if (refusal)
                return self->exchange_->respond_error(refusal->status, refusal->code, refusal->message,
                                                      refusal->retry_after_s);
            self->sandbox_ = self->manager_.find(sandbox->id());
            self->sandbox_id_ = sandbox->id();
            self->make_dirs();
        });
    }

private:
    void make_dirs()
    {
        std::set<std::string> dirs{work_dir};
        for (const auto& [path, bytes] : request_.files) {
            const std::string parent = std::filesystem::path(in_work_dir(path)).parent_path().string();
            if (!parent.empty())
                dirs.insert(parent);
        }
        Json argv = Json::array({"mkdir", "-p", "--"});
        for (const std::string& dir : dirs)
            argv.push_back(dir);
        auto self = shared_from_this();
        send(Json{{"op", "exec"}, {"argv", argv}}, [self](Json&& answer) {
            if (answer.contains("error") || answer.value("exit_code", 1) != 0) {
                std::string why = answer.contains("error") ? answer["error"].value("message", "") : "";
                try {
                    why += get_bytes(answer, "stderr").value_or("");
                } catch (const CallError&) {
                }
                return self->sandbox_error("making the work directory failed: " + why);
            }
            self->write_and_run();
        });
    }

    void write_and_run()
    {
        auto self = shared_from_this();
        const Language& language = languages().at(request_.language);
        // write_file is handled in order before the exec that follows it on the connection.
        auto write = [&](const std::string& path, const std::string& bytes) {
            Json request{{"op", "write_file"}, {"path", path}};
            put_bytes(request, "data", bytes);
            send(std::move(request), [self, path](Json&& answer) {
                if (answer.contains("error"))
                    self->write_failed_ = "writing " + path + ": " + answer["error"].value("message", "");
            });
        };
        for (const auto& [path, bytes] : request_.files)
            write(in_work_dir(path), bytes);
        write(std::string(work_dir) + "/" + language.file, request_.code);
        Json argv = Json::array();
        if (request_.memory_limit_mb > 0) {
            // Address space, in KiB: what `ulimit -v` limits.
            const auto kib = static_cast<int64_t>(request_.memory_limit_mb * 1024);
            argv = Json::array({"bash", "-c", fmt::format("ulimit -v {} && exec \"$0\" \"$@\"", kib)});
        }
        for (const std::string& word : language.command)
            argv.push_back(word);
        Json run{{"op", "exec"}, {"argv", argv}, {"cwd", work_dir}, {"timeout", request_.run_timeout}};
        if (request_.stdin_text)
            put_bytes(run, "stdin", *request_.stdin_text);
        const auto started = Sandbox::Clock::now();
        send(std::move(run), [self, started](Json&& answer) {
            self->manager_.count_call(answer, std::chrono::duration<double>(Sandbox::Clock::now() - started).count());
            self->ran(std::move(answer));
        });
    }

    void ran(Json&& answer)
    {
        if (!write_failed_.empty())
            return sandbox_error(write_failed_);
        if (answer.contains("error")) {
            const std::string message = answer["error"].value("message", "");
            run_result_ = Json{{"status", "Error"}, {"execution_time", nullptr}, {"return_code", nullptr},
                               {"stdout", ""}, {"stderr", message}};
            return sandbox_error(message);
        }
        run_result_ = command_result(answer);
        fetch_next(0);
    }

    void fetch_next(size_t index)
    {
        if (index == request_.fetch_files.size())
            return finish();
        auto self = shared_from_this();
        const std::string path = request_.fetch_files[index];
        auto content = std::make_shared<std::string>();
        CallHandlers handlers;
        handlers.on_event = [content](Json&& event) {
            try {
                content->append(get_bytes(event, "data").value_or(""));
            } catch (const CallError&) {
            }
        };
        handlers.on_answer = [self, path, content, index](Json&& answer) {
            // A file the run did not leave is left out, as SandboxFusion does.
            if (!answer.contains("error"))
                self->fetched_[path] = base64_encode(*content);
            self->fetch_next(index + 1);
        };
        if (auto sandbox = sandbox_.lock())
            sandbox->call(Json{{"op", "read_file"}, {"path", in_work_dir(path)}}, std::nullopt, std::move(handlers));
    }

    void finish()
    {
        const bool success = run_result_["status"] == "Finished" && run_result_["return_code"] == 0;
        respond(success ? "Success" : "Failed", "");
    }

    void sandbox_error(const std::string& message) { respond("SandboxError", message); }

    void respond(const char* status, const std::string& message)
    {
        if (done_)
            return;
        done_ = true;
        Json files = Json::object();
        for (const auto& [path, content] : fetched_)
            files[path] = content;
        const Json answer{{"status", status},         {"message", message},
                          {"compile_result", nullptr}, {"run_result", run_result_},
                          {"executor_pod_name", sandbox_id_.empty() ? Json(nullptr) : Json(sandbox_id_)},
                          {"files", std::move(files)}};
        exchange_->respond(200, answer.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n");
        if (auto sandbox = manager_.find(sandbox_id_))
            manager_.remove(*sandbox, "run_code done");
    }

    void send(Json request, std::function<void(Json&&)> on_answer)
    {
        if (auto sandbox = sandbox_.lock())
            sandbox->call(std::move(request), std::nullopt, CallHandlers{[](Json&&) {}, std::move(on_answer)});
    }

    SandboxManager& manager_;
    std::shared_ptr<HttpExchange> exchange_;
    FusionRequest request_;
    // Weak: the sandbox's pending calls hold this job, and the job must not keep the
    // sandbox (and its VM) alive past serve's end.
    std::weak_ptr<Sandbox> sandbox_;
    std::string sandbox_id_;
    std::string write_failed_;
    Json run_result_ = nullptr;
    std::map<std::string, std::string> fetched_;
    bool done_ = false;
};

} // namespace

void run_code(SandboxManager& manager, const std::shared_ptr<HttpExchange>& exchange)
{
    FusionRequest request = parse(exchange->body());
    if (!languages().contains(request.language)) {
        const Json answer{{"status", "SandboxError"},
                          {"message", fmt::format("language \"{}\" is not supported here (python, bash)",
                                                  request.language)},
                          {"compile_result", nullptr},
                          {"run_result", nullptr},
                          {"executor_pod_name", nullptr},
                          {"files", Json::object()}};
        return exchange->respond(200, answer.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n");
    }
    std::make_shared<RunCodeJob>(manager, exchange, std::move(request))->start();
}

} // namespace agentvm
