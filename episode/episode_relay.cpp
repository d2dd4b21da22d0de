#include "episode/episode_relay.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <vector>
#include <variant>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/file_digest.hpp"
#include "protocol/response_scanner.hpp"
#include "protocol/agent_protocol.hpp"
#include "protocol/env_limits.hpp"
#include "protocol/shell_quote.hpp"

namespace agentvm {
namespace {

using Clock = std::chrono::steady_clock;

// Backpressure: stop reading the side that produces while the other side lags this much.
constexpr size_t max_queued_to_agent = size_t{16} << 20;

bool is_blank(const std::string& line)
{
    return line.find_first_not_of(" \t\r") == std::string::npos;
}

struct CallLimits {
    std::optional<double> timeout_s;
    uint64_t max_output = 0;
};

std::optional<CallLimits> limits_of(const Request& request)
{
    if (const auto* exec = std::get_if<ExecRequest>(&request.op))
        return CallLimits{exec->timeout_s, exec->max_output};
    if (const auto* shell = std::get_if<ShellRequest>(&request.op))
        return CallLimits{shell->timeout_s, shell->max_output};
    if (const auto* run = std::get_if<RunCodeRequest>(&request.op))
        return CallLimits{run->timeout_s, run->max_output};
    return std::nullopt;
}

// The env of a request that runs code (exec, spawn, run_code), which the sandbox's env is merged
// into, the request's own names winning; null for other ops. A context's interpreter started
// before the sandbox's env was set, so its cells get that env each time, as run_code's.
const std::map<std::string, std::string>* command_env(const Request& request)
{
    if (const auto* exec = std::get_if<ExecRequest>(&request.op))
        return &exec->env;
    if (const auto* spawn = std::get_if<SpawnRequest>(&request.op))
        return &spawn->command.env;
    if (const auto* run = std::get_if<RunCodeRequest>(&request.op))
        return &run->env;
    return nullptr;
}

// The env op's bounds are serve's for a sandbox's env (its create request): so many
// variables, names so long, and the request body's 1 MiB for names and values together,
// which also keeps the export (each value quoted, at most 4 bytes a byte) far below a line's
// 64 MiB.
// (max_env_entries and max_env_name_bytes: protocol/env_limits.hpp.)
constexpr size_t max_env_bytes = size_t{1} << 20;
// The export's own time limit: a few builtins, which only a wedged guest takes long over.
constexpr double export_timeout_s = 60;
// A shell variable (not exported) that holds the digest of the env the shell has.
constexpr std::string_view export_marker = "__agentvm_env";

// The host's env op, which the agent's parser refuses as an unknown op: the request, parsed
// again (only a line with an unknown op pays for that), or nullopt when it is not one.
std::optional<Json> env_op_of(const std::string& line, const RequestError& refused)
{
    if (refused.error.code() != "unknown_op")
        return std::nullopt;
    Json request = Json::parse(line, nullptr, false);
    if (!request.is_object() || request.value("op", Json()) != "env")
        return std::nullopt;
    return request;
}

// Throws CallError.
std::map<std::string, std::string> parse_env(const Json& request)
{
    const auto env = request.find("env");
    if (env == request.end())
        throw CallError("missing_field", "missing \"env\"");
    if (!env->is_object() || env->size() > max_env_entries)
        throw CallError("bad_field", fmt::format("\"env\" must be an object of at most {} strings", max_env_entries));
    std::map<std::string, std::string> vars;
    size_t bytes = 0;
    for (const auto& [name, value] : env->items()) {
        if (!is_env_name(name))
            throw CallError("bad_field", fmt::format("\"env\": \"{:.64}\" is not a variable name (letters, digits "
                                                     "and _, not a digit first, at most {} bytes)",
                                                     name, max_env_name_bytes));
        if (!value.is_string() || value.get_ref<const std::string&>().find('\0') != std::string::npos)
            throw CallError("bad_field", fmt::format("\"env\": \"{}\" must be a string without NUL", name));
        bytes += name.size() + value.get_ref<const std::string&>().size();
        if (bytes > max_env_bytes)
            throw CallError("bad_field",
                            fmt::format("\"env\" is limited to {} bytes of names and values", max_env_bytes));
        vars[name] = value.get<std::string>();
    }
    return vars;
}

// The shell command that exports env, unless the shell has exported that very env already,
// which it remembers in export_marker: a VM restored from a snapshot taken after the export
// has it, and exporting again there would undo what its shell changed since (an unset, a new
// value).
std::string export_command(const std::map<std::string, std::string>& env)
{
    std::string exports;
    for (const auto& [name, value] : env)
        exports += " " + name + "=" + shell_quote(value);
    const std::string digest = sha256_hex(exports).substr(0, 16);
    return fmt::format("[ \"${{{0}-}}\" = {1} ] || {{ export{2} && {0}={1}; }}", export_marker, digest, exports);
}

} // namespace

EpisodeRelay::EpisodeRelay(EventLoop& loop, int in_fd, int out_fd, Ended on_end,
                           std::chrono::milliseconds grace, std::optional<double> call_timeout_s,
                           size_t max_request_bytes)
    : loop_(loop), on_end_(std::move(on_end)),
      input_(loop, in_fd, max_request_bytes,
             {[this](std::string&& line) { on_request(std::move(line)); },
              [this] {
                  reply_error("null", "line_too_long",
                              fmt::format("request lines are limited to {} bytes", max_request_bytes_));
              },
              [this](int err) { on_input_end(err); }}),
      out_(loop, out_fd,
           [this](int err) { end(End::output_failed, fmt::format("writing to stdout: {}", std::strerror(err))); }),
      watchdog_(loop, [this] { on_watchdog(); }), grace_(grace), call_timeout_s_(call_timeout_s),
      max_request_bytes_(max_request_bytes)
{
}

void EpisodeRelay::start(Fd agent, std::string announcement)
{
    if (!announcement.empty())
        emit(std::move(announcement));
    agent_ = std::move(agent);
    const int fd = agent_.get();
    agent_out_.emplace(loop_, fd, [this](int err) {
        end(End::agent_lost, fmt::format("the connection to the guest agent failed: {}", std::strerror(err)));
    });
    agent_in_.emplace(loop_, fd, max_response_line,
                      ResponseStream::Handlers{
                          [this](std::string bytes) {
                              if (!ended_)
                                  emit(std::move(bytes));
                          },
                          [this](const std::optional<std::string>& id) { return id && pending_.contains(*id); },
                          [this](const std::string& id) { on_progress(id); },
                          [this](const ResponseSummary& summary) { on_response(summary); },
                          [this](const ResponseSummary& summary) { on_stray_line(summary); },
                          [this](const std::string& why) { end(End::agent_protocol, why); },
                          [this](int err) { on_agent_end(err); }});
    agent_in_->start();
    input_.start();
}

void EpisodeRelay::on_request(std::string&& line)
{
    if (ended_ || input_done_ || is_blank(line))
        return;
    if (snapshot_running_ || !snapshots_waiting_.empty()) {
        // Read along with the snapshot's line, before input paused: it waits for the snapshot.
        held_lines_.push_back(std::move(line));
        return;
    }
    std::string id;
    std::optional<CallLimits> limits;
    bool is_close = false;
    bool is_shell = false;
    bool follows = false;
    std::optional<std::string> snapshot_name;
    std::optional<std::string> env;  // a command's or a cell's env with the sandbox's merged in
    {
        // Scoped: the parsed request (its data decoded) is gone before the line is queued.
        Request request;
        try {
            request = parse_request(line);
        } catch (const RequestError& e) {
            if (const std::optional<Json> env_request = env_op_of(line, e)) {
                if (id_free(e.id.dump()))
                    set_env(e.id.dump(), *env_request);
                return;
            }
            reply_error(e.id.dump(), e.error.code(), e.error.what());
            return;
        }
        id = request.id.dump();
        if (std::holds_alternative<ResumeRequest>(request.op)) {
            reply_error(id, "unknown_op",
                        "op \"resume\" is agentvm's own (it sends it after a snapshot restore); a harness "
                        "cannot send it");
            return;
        }
        limits = limits_of(request);
        is_close = std::holds_alternative<CloseRequest>(request.op);
        is_shell = std::holds_alternative<ShellRequest>(request.op);
        follows = std::holds_alternative<AttachRequest>(request.op) || std::holds_alternative<WatchRequest>(request.op);
        if (const auto* snapshot = std::get_if<SnapshotRequest>(&request.op))
            snapshot_name = snapshot->name;
        if (const auto* own = command_env(request); own && !env_.empty()) {
            Json merged = Json::object();
            for (const auto& [name, value] : env_)
                merged[name] = value;
            for (const auto& [name, value] : *own)
                merged[name] = value;
            env = merged.dump(-1, ' ', false, Json::error_handler_t::replace);
        }
    }
    if (!id_free(id))
        return;
    if (snapshot_name) {
        start_snapshot(id, *snapshot_name);
        return;
    }
    Pending pending{id, requests_++, std::nullopt, is_shell, follows};
    // Fields added at the end of the line, where they override the request's own (JSON's last
    // duplicate wins).
    std::string added;
    if (env)
        added = ",\"env\":" + *env;
    if (limits) {
        if (limits->max_output > max_output_limit) {
            reply_error(id, "bad_field",
                        fmt::format("\"max_output\" is limited to {} bytes in an episode", max_output_limit));
            return;
        }
        std::optional<double> timeout_s = limits->timeout_s;
        if (!timeout_s && call_timeout_s_) {
            // Also overrides a "timeout":null.
            timeout_s = call_timeout_s_;
            added += fmt::format(",\"timeout\":{}", *timeout_s);
        }
        if (timeout_s)
            pending.deadline = Clock::now()
                + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(*timeout_s))
                + grace_;
    }
    // What goes after the line's closing brace, up to and with its newline: written apart
    // from the line, which may be 64 MiB and is not copied to make room.
    std::string tail = "\n";
    if (!added.empty()) {
        if (line.size() + added.size() > max_request_bytes_) {
            reply_error(id, "bad_field",
                        fmt::format("with what the episode adds to it (the sandbox's env, the default "
                                    "timeout), the request would be longer than {} bytes",
                                    max_request_bytes_));
            return;
        }
        // The line is an object (it parsed), so it ends with its closing brace.
        const size_t brace = line.find_last_of('}');
        tail = added + std::string(std::string_view(line).substr(brace)) + "\n";
        line.resize(brace);
    }
    pending_.emplace(std::move(id), std::move(pending));
    arm_watchdog();

    // Shell calls run in the order they are sent: the export goes first.
    if (is_shell && env_due_)
        export_env();
    agent_out_->write(std::move(line));
    agent_out_->write(std::move(tail));
    if (agent_out_->queued_bytes() > max_queued_to_agent) {
        input_.pause();
        agent_out_->when_flushed([this] {
            if (!input_done_)
                input_.resume();
        });
    }
    if (is_close) {
        // The agent ignores what follows a close; so do we, and stop reading.
        input_done_ = true;
        input_.pause();
    }
}

bool EpisodeRelay::id_free(const std::string& id)
{
    if (id.size() > max_id_bytes) {
        reply_error(id, "bad_field", fmt::format("\"id\" is limited to {} bytes in an episode", max_id_bytes));
        return false;
    }
    if (pending_.contains(id) || host_pending_.contains(id) || exports_.contains(id)) {
        reply_error(id, "bad_field",
                    fmt::format("\"id\" {} is already used by a call that has not answered yet", id));
        return false;
    }
    return true;
}

void EpisodeRelay::preset_env(std::map<std::string, std::string> env)
{
    base_env_ = std::move(env);
    env_ = base_env_;
    env_due_ = !env_.empty();
}

void EpisodeRelay::set_env(const std::string& id, const Json& request)
{
    try {
        env_ = parse_env(request);
        for (const auto& [name, value] : base_env_)
            env_.try_emplace(name, value);
    } catch (const CallError& e) {
        reply_error(id, e.code(), e.what());
        return;
    }
    env_due_ = !env_.empty();
    Json answer = Json::object();
    answer["id"] = Json::parse(id);
    answer["ok"] = true;
    emit(to_line(answer));
}

void EpisodeRelay::export_env()
{
    env_due_ = false;
    std::string id;
    do
        id = Json(fmt::format("agentvm-env-{}", ++exports_made_)).dump();
    while (pending_.contains(id) || host_pending_.contains(id));
    exports_.insert(id);
    Json call = Json::object();
    call["id"] = Json::parse(id);
    call["op"] = "shell";
    call["cmd"] = export_command(env_);
    call["timeout"] = export_timeout_s;
    agent_out_->write(to_line(call));
}

void EpisodeRelay::start_snapshot(const std::string& id, const std::string& name)
{
    if (!snapshot_handler_) {
        reply_error(id, "unavailable",
                    "this episode takes no snapshots: start agentvm episode with --snapshot-dir DIR");
        return;
    }
    host_pending_.emplace(id, Pending{id, requests_++, std::nullopt});
    // The snapshot holds what every call before it did, and nothing of a call after it: no
    // request is read until it is taken, and it waits for the calls still running.
    snapshots_waiting_.push_back({id, name});
    input_.pause();
    take_next_snapshot();
}

void EpisodeRelay::take_next_snapshot()
{
    const bool calls_running = std::any_of(pending_.begin(), pending_.end(),
                                           [](const auto& entry) { return !entry.second.follows; });
    if (snapshot_running_ || snapshots_waiting_.empty() || calls_running || ended_)
        return;
    // Named copies, not a structured binding: clang 14 cannot capture a binding in a lambda.
    const std::string id = snapshots_waiting_.front().first;
    const std::string name = snapshots_waiting_.front().second;
    snapshots_waiting_.pop_front();
    snapshot_running_ = true;
    snapshot_handler_(name, [this, id](Json answer) {
        snapshot_running_ = false;
        if (!host_pending_.erase(id) || ended_)
            return;  // fail_pending() has answered it
        Json line = Json::object();
        line["id"] = Json::parse(id);
        line.update(answer);
        emit(to_line(line));
        if (agent_done_ && host_pending_.empty()) {
            end(End::finished, "");
            return;
        }
        if (!snapshots_waiting_.empty())
            return take_next_snapshot();
        while (!held_lines_.empty() && snapshots_waiting_.empty() && !snapshot_running_) {
            std::string held = std::move(held_lines_.front());
            held_lines_.pop_front();
            on_request(std::move(held));
        }
        if (snapshots_waiting_.empty() && !snapshot_running_ && !input_done_ && !ended_ &&
            agent_out_->queued_bytes() <= max_queued_to_agent)
            input_.resume();
    });
}

void EpisodeRelay::on_input_end(int err)
{
    if (err != 0)
        spdlog::warn("reading stdin: {}; no more requests", std::strerror(err));
    if (input_done_ || ended_)
        return;
    input_done_ = true;
    // Half-close toward the agent once every request is out: it answers what is running,
    // then closes the connection, which ends the episode.
    agent_out_->when_flushed([this] {
        if (agent_)
            ::shutdown(agent_.get(), SHUT_WR);
    });
}

void EpisodeRelay::on_response(const ResponseSummary& summary)
{
    if (ended_ || !summary.id)
        return;
    if (summary.is_event) {
        on_progress(*summary.id);
        return;
    }
    const auto call = pending_.find(*summary.id);
    if (call == pending_.end())
        return;
    if (call->second.shell && (summary.timed_out || summary.cancelled))
        env_due_ = !env_.empty();  // its shell was killed; the next one starts without the env
    pending_.erase(call);
    arm_watchdog();
    take_next_snapshot();
}

void EpisodeRelay::on_stray_line(const ResponseSummary& summary)
{
    if (ended_)
        return;
    const std::string id = summary.id.value_or("none");
    if (summary.id && exports_.contains(*summary.id)) {
        if (summary.is_event) {
            // The export asks for no events: the guest has taken over the agent's connection.
            end(End::agent_protocol,
                fmt::format("the guest sent an event about call {:.64}, the host's own export of the env, which "
                            "streams nothing: a forged answer",
                            id));
            return;
        }
        exports_.erase(*summary.id);
        if (summary.timed_out || summary.cancelled)
            env_due_ = !env_.empty();
        return;
    }
    if (summary.id && host_pending_.contains(*summary.id)) {
        // Only the host answers its own calls: the guest has taken over the agent's connection.
        end(End::agent_protocol,
            fmt::format("the guest sent a line about call {:.64}, which is the host's own (a snapshot): a forged "
                        "answer",
                        id));
        return;
    }
    ++stray_lines_;
    guest_warn(stray_warnings_, "the guest agent sent a line about no call in flight (id {:.64}); dropped ({} so far)",
               id, stray_lines_);
}

void EpisodeRelay::on_progress(const std::string& id)
{
    const auto call = pending_.find(id);
    if (call == pending_.end() || !call->second.deadline)
        return;
    const auto later = Clock::now() + grace_;
    if (*call->second.deadline < later) {
        call->second.deadline = later;
        arm_watchdog();
    }
}

void EpisodeRelay::on_agent_end(int err)
{
    if (ended_)
        return;
    if (err == 0 && pending_.empty() && input_done_) {
        if (host_pending_.empty())
            end(End::finished, "");
        else
            agent_done_ = true;
        return;
    }
    end(End::agent_lost,
        err != 0 ? fmt::format("reading from the guest agent failed: {}", std::strerror(err))
                 : fmt::format("the guest agent closed the connection with {} call(s) unanswered",
                               pending_.size()));
}

void EpisodeRelay::reply_error(const std::string& id_json, const std::string& code,
                               const std::string& message)
{
    emit(to_line(error_response(Json::parse(id_json), code, message)));
}

void EpisodeRelay::emit(std::string line)
{
    out_.write(std::move(line));
    if (!ended_ && agent_in_ && !agent_paused_ && out_.queued_bytes() > max_queued_to_output) {
        // The harness is not keeping up: let the agent's output wait in the guest instead.
        agent_in_->pause();
        agent_paused_ = true;
        out_.when_flushed([this] {
            agent_paused_ = false;
            if (ended_)
                return;
            // Meanwhile the agent could not be heard: no call's silence counts until now.
            const auto later = Clock::now() + grace_;
            for (auto& [id, call] : pending_)
                if (call.deadline && *call.deadline < later)
                    call.deadline = later;
            arm_watchdog();
            agent_in_->resume();
        });
    }
}

void EpisodeRelay::arm_watchdog()
{
    std::optional<Clock::time_point> earliest;
    for (const auto& [id, call] : pending_)
        if (call.deadline && (!earliest || *call.deadline < *earliest))
            earliest = call.deadline;
    if (earliest)
        watchdog_.arm(*earliest - Clock::now());
    else
        watchdog_.cancel();
}

void EpisodeRelay::on_watchdog()
{
    if (agent_paused_)
        return;  // re-armed when reading resumes
    const auto now = Clock::now();
    for (const auto& [id, call] : pending_) {
        if (call.deadline && *call.deadline <= now) {
            end(End::watchdog,
                fmt::format("call {} sent nothing of its answer for {} s past its timeout: the guest is "
                            "not responding", id, std::chrono::duration<double>(grace_).count()));
            return;
        }
    }
    arm_watchdog();
}

void EpisodeRelay::end(End how, const std::string& why)
{
    if (ended_ || stopping_)
        return;
    if (agent_in_)
        agent_in_->stop();
    ended_ = true;
    input_.pause();
    watchdog_.cancel();
    on_end_(how, why);
}

size_t EpisodeRelay::fail_pending(const std::string& code, const std::string& message)
{
    if (agent_in_)
        agent_in_->stop();
    ended_ = true;
    std::vector<const Pending*> calls;
    for (const auto& [id, call] : pending_)
        calls.push_back(&call);
    for (const auto& [id, call] : host_pending_)
        calls.push_back(&call);
    // Requests held behind a snapshot never reached the agent: they fail too, after the rest.
    std::vector<Pending> held;
    for (const std::string& line : held_lines_) {
        const Json request = Json::parse(line, nullptr, false);
        const bool has_id = request.is_object() && request.contains("id");
        held.push_back({has_id ? request["id"].dump() : "null", requests_++, std::nullopt});
    }
    held_lines_.clear();
    for (const Pending& call : held)
        calls.push_back(&call);
    std::sort(calls.begin(), calls.end(), [](auto* a, auto* b) { return a->order < b->order; });
    for (const Pending* call : calls)
        emit(to_line(error_response(Json::parse(call->id_json), code, message)));
    const size_t count = calls.size();
    pending_.clear();
    host_pending_.clear();
    return count;
}

} // namespace agentvm
