#include "guest/agent/interpreter.hpp"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "guest/agent/capture.hpp"
#include "guest/agent/drain.hpp"
#include "guest/agent/interpreter_driver.hpp"
#include "protocol/json_depth.hpp"

namespace agentvm {

namespace {

// The longest status line taken from the driver: a result of max_result_bytes and a message
// and a traceback of 64 KiB each, every byte escaped at most six-fold, and rich forms of
// max_forms_bytes as JSON text, with room to spare.
constexpr size_t max_status_line = 16u << 20;

bool is_string_array(const Json& value)
{
    return value.is_array() && std::all_of(value.begin(), value.end(), [](const Json& v) { return v.is_string(); });
}

// A display line of the driver's, checked (the cell could have written it): the event it
// becomes, or nullopt.
std::optional<Json> display_event(const Json& id, Json& line)
{
    const auto formats = line.find("formats");
    const auto truncated = line.find("formats_truncated");
    if (formats == line.end() || !formats->is_object() || truncated == line.end() || !is_string_array(*truncated))
        return std::nullopt;
    return Json{{"id", id}, {"event", "display"}, {"formats", std::move(*formats)},
                {"formats_truncated", std::move(*truncated)}};
}

// Reads the driver's status FIFO during a cell: the cell is over when its line arrives; its
// display lines before that go on as events, as many as max_displays and max_display_bytes let
// (the rest are counted in displays_dropped). A line about an earlier cell is skipped: one a
// cell forged came first, and the real one after.
class StatusJson final : public Watch {
public:
    StatusJson(int fd, std::string& pending, uint64_t cell, const Json& id, Outbox& outbox)
        : fd_(fd), pending_(pending), cell_(cell), id_(id), outbox_(outbox)
    {
    }

    int fd() const override { return fd_; }
    short events() const override { return POLLIN; }
    bool ready(short revents) override
    {
        if (!(revents & POLLIN))
            return false;
        char buffer[64 * 1024];
        const ssize_t got = ::read(fd_, buffer, sizeof(buffer));
        if (got > 0)
            pending_.append(buffer, static_cast<size_t>(got));
        for (size_t newline; (newline = pending_.find('\n')) != std::string::npos;) {
            const std::string_view text = std::string_view(pending_).substr(0, newline);
            // Deeper nesting than the protocol's would make the response one the host refuses.
            Json status = json_depth_within(text) ? Json::parse(text, nullptr, false) : Json();
            const size_t line_bytes = newline + 1;
            pending_.erase(0, line_bytes);
            const auto cell = status.is_object() ? status.find("cell") : status.end();
            if (cell != status.end() && cell->is_number_unsigned() && cell->get<uint64_t>() < cell_)
                continue;
            if (cell == status.end() || *cell != cell_) {
                malformed = true;
                return true;
            }
            if (status.value("event", Json()) == "display") {
                std::optional<Json> event = display_event(id_, status);
                if (!event) {
                    malformed = true;
                    return true;
                }
                if (displays_ < Interpreter::max_displays
                    && display_bytes_ + line_bytes <= Interpreter::max_display_bytes) {
                    ++displays_;
                    display_bytes_ += line_bytes;
                    outbox_.send_message(std::move(*event));
                } else {
                    ++displays_dropped;
                }
                continue;
            }
            line = std::move(status);
            return true;
        }
        if (pending_.size() <= max_status_line)
            return false;
        malformed = true;
        return true;
    }

    std::optional<Json> line;  // this cell's status, not yet checked
    bool malformed = false;
    uint64_t displays_dropped = 0;

private:
    int fd_;
    std::string& pending_;
    uint64_t cell_;
    const Json& id_;
    Outbox& outbox_;
    uint64_t displays_ = 0;
    size_t display_bytes_ = 0;
};

bool is_string_or_null(const Json& object, const char* name)
{
    const auto it = object.find(name);
    return it != object.end() && (it->is_string() || it->is_null());
}

// The driver's line, checked: the cell shares the driver's process, so what arrives on the
// status FIFO is not trusted to be the driver's.
std::optional<Json> checked_status(Json status)
{
    if (!status.is_object() || !is_string_or_null(status, "result") || !status.contains("result_truncated")
        || !status["result_truncated"].is_boolean() || !status.contains("exception") || !status.contains("formats")
        || !status["formats"].is_object() || !status.contains("formats_truncated")
        || !is_string_array(status["formats_truncated"]) || !status.contains("displays_dropped")
        || !status["displays_dropped"].is_number_unsigned())
        return std::nullopt;
    const Json& exception = status["exception"];
    if (!exception.is_null()
        && (!exception.is_object() || !is_string_or_null(exception, "type") || !is_string_or_null(exception, "message")
            || !is_string_or_null(exception, "traceback")))
        return std::nullopt;
    return status;
}

Json interpreter_died(const std::string& how)
{
    return Json{{"type", "InterpreterDied"}, {"message", how}, {"traceback", nullptr}};
}

std::string how_it_ended(int wait_status)
{
    if (WIFSIGNALED(wait_status))
        return "the interpreter was killed by signal " + std::to_string(WTERMSIG(wait_status));
    return "the interpreter exited with status " + std::to_string(WEXITSTATUS(wait_status));
}

} // namespace

Json Interpreter::not_run(const Json& id)
{
    return Json{{"id", id}, {"result", nullptr}, {"result_truncated", false}, {"formats", Json::object()},
                {"formats_truncated", Json::array()}, {"exception", nullptr},
                {"timed_out", false}, {"state_lost", false}, {"cancelled", true}, {"stdout", ""},
                {"stdout_truncated", false}, {"stderr", ""}, {"stderr_truncated", false}, {"duration_ms", 0}};
}

Json Interpreter::run(const Json& id, const RunCodeRequest& request, Outbox& outbox, int cancel_fd)
{
    if (!python_.running()) {
        try {
            python_.start({"python3", "-u", "-c", interpreter_driver_source}, cwd_);
        } catch (const CallError& e) {
            throw CallError("spawn_failed", std::string("run_code needs python3: ") + e.what());
        }
    }
    const uint64_t cell = python_.next_command();
    SessionProcess::Fifo out(python_, "out." + std::to_string(cell));
    SessionProcess::Fifo err(python_, "err." + std::to_string(cell));
    Capture captures[2] = {
        {"stdout", std::move(out.fd), request.max_output, request.output_in_response},
        {"stderr", std::move(err.fd), request.max_output, request.output_in_response},
    };

    const Clock::time_point start_time = Clock::now();
    const Json command{{"code", request.code},
                       {"cell", cell},
                       {"out", out.path},
                       {"err", err.path},
                       {"status", python_.status_path()},
                       {"result_limit", std::min(request.max_output, max_result_bytes)},
                       {"forms_limit", max_forms_bytes},
                       {"display_limit", max_displays},
                       {"env", request.env}};
    python_.send(to_line(command));

    StatusJson status_line(python_.status_fd(), python_.status_pending(), cell, id, outbox);
    const Drained drained = drain({python_.pid(), python_.cgroup(), python_.pidfd(), cancel_fd,
                                   deadline_after(start_time, request.timeout_s),
                                   std::chrono::duration_cast<Clock::duration>(interrupt_grace)},
                                  captures, status_line, id, request.stream, outbox);

    Json response{{"id", id}, {"result", nullptr}, {"result_truncated", false}, {"formats", Json::object()},
                  {"formats_truncated", Json::array()}};
    uint64_t displays_dropped = status_line.displays_dropped;
    std::optional<Json> status;
    if (!drained.wait_status && status_line.line)
        status = checked_status(std::move(*status_line.line));
    if (status) {
        response["result"] = std::move((*status)["result"]);
        response["result_truncated"] = (*status)["result_truncated"];
        response["formats"] = std::move((*status)["formats"]);
        response["formats_truncated"] = std::move((*status)["formats_truncated"]);
        response["exception"] = std::move((*status)["exception"]);
        // Saturating: the count is the driver's, which the cell could have forged.
        displays_dropped += std::min((*status)["displays_dropped"].get<uint64_t>(), UINT64_MAX - displays_dropped);
    } else if (drained.wait_status) {
        python_.reaped();
        std::string how = how_it_ended(*drained.wait_status);
        if (drained.killed_by_cancel)
            how += " (the call was cancelled)";
        else if (drained.timed_out)
            how += " (the cell did not stop within " + std::to_string(interrupt_grace.count())
                + " s of the timeout's interrupt)";
        response["exception"] = interpreter_died(how);
    } else {
        python_.stop();
        response["exception"] = interpreter_died("the interpreter sent a malformed status line; it was stopped");
    }
    response["timed_out"] = drained.timed_out;
    response["state_lost"] = !status;
    if (displays_dropped > 0)
        response["displays_dropped"] = displays_dropped;
    put_outcome(response, drained, captures, start_time);
    return response;
}

} // namespace agentvm
