#include "service/fusion/run_code.hpp"

#include <map>

#include <fmt/format.h>

#include "service/problem.hpp"
#include "service/create_request.hpp"
#include "service/fusion/fusion_job.hpp"

namespace agentvm {
namespace {


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
    FusionFiles files;
};

// SandboxFusion's /run_code request; fields it does not know are ignored, as it ignores them.
FusionRequest parse_run_code_request(const std::string& text)
{
    const Json body = fusion_body(text);
    FusionRequest request;
    if (!body.contains("code") || !body["code"].is_string())
        throw_bad_field("\"code\" (a string) is required");
    request.code = body["code"].get<std::string>();
    if (!body.contains("language") || !body["language"].is_string())
        throw_bad_field("\"language\" (a string) is required");
    request.language = body["language"].get<std::string>();
    fusion_number(body, "compile_timeout", 10, 0, max_sandbox_timeout_s);
    request.run_timeout = fusion_number(body, "run_timeout", 10, 0.001, max_sandbox_timeout_s);
    request.memory_limit_mb = fusion_number(body, "memory_limit_MB", -1, -1, 1 << 20);
    if (body.contains("stdin") && !body["stdin"].is_null()) {
        if (!body["stdin"].is_string())
            throw_bad_field("\"stdin\" must be a string");
        request.stdin_text = body["stdin"].get<std::string>();
    }
    request.files = parse_fusion_files(body);
    return request;
}

Json command_result(const Json& answer, uint64_t max_output)
{
    const std::string out = output_of(answer, "stdout", max_output);
    const std::string err = output_of(answer, "stderr", max_output);
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

class RunCodeJob final : public FusionJob {
public:
    RunCodeJob(SandboxManager& manager, std::shared_ptr<HttpExchange> exchange, FusionRequest request)
        : FusionJob(manager, std::move(exchange), std::move(request.files)), request_(std::move(request))
    {
    }

private:
    void run() override
    {
        const Language& language = languages().at(request_.language);
        Json write{{"op", "write_file"}, {"path", std::string(fusion_work_dir) + "/" + language.file}};
        put_bytes(write, "data", request_.code);
        auto self = std::static_pointer_cast<RunCodeJob>(shared_from_this());
        send(std::move(write), [self](Json&& answer) {
            if (answer.contains("error"))
                self->code_write_failed_ = true;
        });
        Json argv = Json::array();
        if (request_.memory_limit_mb > 0) {
            // Address space, in KiB: what `ulimit -v` limits.
            const auto kib = static_cast<int64_t>(request_.memory_limit_mb * 1024);
            argv = Json::array({"bash", "-c", fmt::format("ulimit -v {} && exec \"$0\" \"$@\"", kib)});
        }
        for (const std::string& word : language.command)
            argv.push_back(word);
        Json run{{"op", "exec"},
                 {"argv", argv},
                 {"cwd", fusion_work_dir},
                 {"timeout", request_.run_timeout},
                 {"max_output", output_max()}};
        if (request_.stdin_text)
            put_bytes(run, "stdin", *request_.stdin_text);
        send(std::move(run), [self](Json&& answer) { self->ran(std::move(answer)); });
    }

    void ran(Json&& answer)
    {
        if (code_write_failed_)
            return sandbox_error("writing the code to the work directory failed");
        if (answer.contains("error")) {
            const std::string message = answer["error"].value("message", "");
            run_result_ = Json{{"status", "Error"}, {"execution_time", nullptr}, {"return_code", nullptr},
                               {"stdout", ""}, {"stderr", message}};
            return sandbox_error(message);
        }
        run_result_ = command_result(answer, output_max());
        const bool success = run_result_["status"] == "Finished" && run_result_["return_code"] == 0;
        done(success ? "Success" : "Failed");
    }

    void describe(Json& answer) const override
    {
        answer["compile_result"] = nullptr;
        answer["run_result"] = run_result_;
    }

    FusionRequest request_;
    bool code_write_failed_ = false;
    Json run_result_ = nullptr;
};

} // namespace

void run_code(SandboxManager& manager, const std::shared_ptr<HttpExchange>& exchange)
{
    FusionRequest request = parse_run_code_request(exchange->body());
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
    const double lifetime_s = request.run_timeout + fusion_sandbox_slack_s;
    Json metadata{{"run_code", request.language}};
    std::make_shared<RunCodeJob>(manager, exchange, std::move(request))->start(lifetime_s, std::move(metadata));
}

} // namespace agentvm
