#include "service/fusion/run_jupyter.hpp"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "service/problem.hpp"
#include "service/create_request.hpp"
#include "service/fusion/fusion_job.hpp"

namespace agentvm {
namespace {

constexpr size_t max_cells = 256;

struct JupyterRequest {
    std::vector<std::string> cells;
    double cell_timeout = 0;  // 0: none but the total
    double total_timeout = 45;
    FusionFiles files;
};

JupyterRequest parse_jupyter_request(const std::string& text)
{
    const Json body = fusion_body(text);
    JupyterRequest request;
    if (!body.contains("cells") || !body["cells"].is_array() || body["cells"].empty()
        || body["cells"].size() > max_cells)
        throw_bad_field(fmt::format("\"cells\" (an array of 1 to {} strings) is required", max_cells));
    for (const Json& cell : body["cells"]) {
        if (!cell.is_string())
            throw_bad_field("\"cells\" must be an array of strings");
        request.cells.push_back(cell.get<std::string>());
    }
    request.cell_timeout = fusion_number(body, "cell_timeout", 0, 0, max_sandbox_timeout_s);
    request.total_timeout = fusion_number(body, "total_timeout", 45, 0.001, max_sandbox_timeout_s);
    if (body.contains("kernel") && !body["kernel"].is_null() && body["kernel"] != "python3")
        throw_bad_field("\"kernel\" must be \"python3\", the only kernel here");
    request.files = parse_fusion_files(body);
    return request;
}

// The agent's traceback text as Jupyter's list of lines, each with its newline.
Json traceback_lines(const std::string& text)
{
    Json lines = Json::array();
    size_t start = 0;
    while (start < text.size()) {
        const size_t newline = text.find('\n', start);
        const size_t end = newline == std::string::npos ? text.size() : newline + 1;
        lines.push_back(text.substr(start, end - start));
        start = end;
    }
    return lines;
}

// A string field of `object`, at most `max_bytes` of it ("" when it is not a string).
std::string text_of(const Json& object, const char* name, size_t max_bytes)
{
    const auto it = object.find(name);
    if (it == object.end() || !it->is_string())
        return "";
    return it->get_ref<const std::string&>().substr(0, max_bytes);
}

} // namespace

Json jupyter_cell_result(const Json& answer, uint64_t max_output)
{
    const std::string out = output_of(answer, "stdout", max_output);
    const std::string err = output_of(answer, "stderr", max_output);
    Json display = Json::array();
    if (answer.contains("result") && answer["result"].is_string())
        display.push_back(
            Json{{"text/plain", text_of(answer, "result", std::min<uint64_t>(max_output, jupyter_result_kept))}});
    Json error = Json::array();
    if (const auto it = answer.find("exception"); it != answer.end() && it->is_object()) {
        const std::string type = text_of(*it, "type", jupyter_exception_text_kept);
        const std::string traceback = text_of(*it, "traceback", jupyter_exception_text_kept);
        error.push_back(Json{{"ename", type},
                             {"evalue", text_of(*it, "message", jupyter_exception_text_kept)},
                             {"traceback", traceback_lines(traceback)}});
    }
    return Json{{"stdout", out}, {"stderr", err}, {"display", std::move(display)}, {"error", std::move(error)}};
}

namespace {

class RunJupyterJob final : public FusionJob {
public:
    RunJupyterJob(SandboxManager& manager, std::shared_ptr<HttpExchange> exchange, JupyterRequest request)
        : FusionJob(manager, std::move(exchange), std::move(request.files)), request_(std::move(request))
    {
    }

private:
    void run() override
    {
        started_ = Sandbox::Clock::now();
        output_left_ = output_max();
        // The cells' working directory is the one their files are in, as in SandboxFusion.
        auto self = std::static_pointer_cast<RunJupyterJob>(shared_from_this());
        send(Json{{"op", "run_code"}, {"code", fmt::format("import os\nos.chdir('{}')", fusion_work_dir)}},
             [self](Json&& answer) {
                 if (answer.contains("error") || !answer["exception"].is_null())
                     return self->sandbox_error("starting the interpreter failed: " + answer.dump());
                 self->run_cell(0);
             });
    }

    double seconds_left() const
    {
        return request_.total_timeout - std::chrono::duration<double>(Sandbox::Clock::now() - started_).count();
    }

    void run_cell(size_t index)
    {
        if (index == request_.cells.size())
            return finish("Finished", "Success");
        const double left = seconds_left();
        if (left <= 0)
            return finish("TimeLimitExceeded", "Failed");
        const double timeout = request_.cell_timeout > 0 ? std::min(request_.cell_timeout, left) : left;
        auto self = std::static_pointer_cast<RunJupyterJob>(shared_from_this());
        // Each cell may keep what the cells before it left of the request's output.
        const uint64_t max_output = output_left_;
        send(Json{{"op", "run_code"}, {"code", request_.cells[index]}, {"timeout", timeout}, {"max_output", max_output}},
             [self, index, max_output](Json&& answer) {
                 if (answer.contains("error"))
                     return self->sandbox_error(answer["error"].value("message", ""));
                 Json cell = jupyter_cell_result(answer, max_output);
                 const Json& display = cell["display"];
                 const uint64_t kept =
                     std::max(cell["stdout"].get_ref<const std::string&>().size(),
                              cell["stderr"].get_ref<const std::string&>().size())
                     + (display.empty() ? 0 : display[0]["text/plain"].get_ref<const std::string&>().size());
                 self->output_left_ -= std::min(self->output_left_, kept);
                 self->cells_.push_back(std::move(cell));
                 if (answer.value("timed_out", false))
                     return self->finish("TimeLimitExceeded", "Failed");
                 if (!answer["exception"].is_null())
                     return self->finish("Finished", "Failed");
                 self->run_cell(index + 1);
             });
    }

    void finish(const char* driver_status, const char* status)
    {
        driver_ = Json{{"status", driver_status},
                       {"execution_time", std::chrono::duration<double>(Sandbox::Clock::now() - started_).count()},
                       {"return_code", 0},
                       {"stdout", nullptr},
                       {"stderr", nullptr}};
        done(status);
    }

    void describe(Json& answer) const override
    {
        answer["driver"] = driver_;
        answer["cells"] = cells_;
    }

    JupyterRequest request_;
    Sandbox::Clock::time_point started_{};
    Json driver_ = nullptr;
    Json cells_ = Json::array();
    uint64_t output_left_ = 0;
};

} // namespace

void run_jupyter(SandboxManager& manager, const std::shared_ptr<HttpExchange>& exchange)
{
    JupyterRequest request = parse_jupyter_request(exchange->body());
    const double lifetime_s = request.total_timeout + fusion_sandbox_slack_s;
    std::make_shared<RunJupyterJob>(manager, exchange, std::move(request))
        ->start(lifetime_s, Json{{"run_jupyter", "python3"}});
}

} // namespace agentvm
