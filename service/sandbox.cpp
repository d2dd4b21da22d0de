#include "service/sandbox.hpp"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "service/wall_clock.hpp"

namespace agentvm {
namespace {

// The last line agentvm wrote on stderr: why an episode ended, in its own words.
std::string last_line(const std::string& text)
{
    const size_t end = text.find_last_not_of("\n ");
    if (end == std::string::npos)
        return {};
    const size_t newline = text.rfind('\n', end);
    const size_t start = newline == std::string::npos ? 0 : newline + 1;
    return text.substr(start, end - start + 1);
}

std::string describe_exit(int wait_status)
{
    if (WIFSIGNALED(wait_status))
        return fmt::format("the episode process was killed by signal {} ({})", WTERMSIG(wait_status),
                           strsignal(WTERMSIG(wait_status)));
    return fmt::format("the episode process exited with status {}", WEXITSTATUS(wait_status));
}

} // namespace

Sandbox::Sandbox(EventLoop& loop, std::string pool, const std::string& program, const std::vector<std::string>& args,
                 size_t history_limit, Hooks hooks)
    : loop_(loop), pool_(std::move(pool)), hooks_(std::move(hooks)), history_(history_limit)
{
    episode_ = std::make_unique<EpisodeProcess>(
        loop_, program, args,
        EpisodeProcess::Handlers{
            [this](bool restored) {
                ready_ = true;
                restored_ = restored;
                hooks_.on_ready(*this, restored);
            },
            [this](std::string&& line) { on_line(std::move(line)); },
            [this](const std::string& why) { broken_reason_ = why; },
            [this](int wait_status) { on_exit(wait_status); }});
}

Sandbox::~Sandbox() = default;

void Sandbox::assign(Settings settings)
{
    settings_ = std::move(settings);
    assigned_at_ = Clock::now();
    assigned_wall_ = std::chrono::system_clock::now();
    deadline_ = assigned_at_ + settings_.timeout;
    last_activity_ = assigned_at_;
    send_env();
}

void Sandbox::change_egress(std::optional<EgressRules> egress, const std::map<std::string, std::string>& env_added)
{
    settings_.egress = std::move(egress);
    bool changed = false;
    for (const auto& [name, value] : env_added)
        changed |= settings_.env.try_emplace(name, value).second;
    if (changed)
        send_env();
}

void Sandbox::send_env()
{
    if (settings_.env.empty())
        return;
    // The episode's relay merges the env into each exec and exports it in the shell
    // (docs/protocol.md, "env"); a fork or resume child gets it again here, harmlessly.
    Json env = Json::object();
    for (const auto& [name, value] : settings_.env)
        env[name] = value;
    send(Json{{"op", "env"}, {"env", std::move(env)}},
         Call{.handlers = CallHandlers{[](Json&&) {},
                                       [id = settings_.id](Json&& answer) {
                                           if (answer.contains("error"))
                                               spdlog::warn("sandbox {}: its env was refused: {}", id,
                                                            answer["error"].dump());
                                       }},
              .history_seq = std::nullopt,
              .counts_as_activity = false,
              .users = false});
}

void Sandbox::set_timeout(std::chrono::seconds timeout)
{
    settings_.timeout = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - assigned_at_) + timeout;
    deadline_ = Clock::now() + timeout;
}

std::optional<std::string> Sandbox::expired(Clock::time_point now) const
{
    if (!assigned() || stopping())
        return std::nullopt;
    if (now >= deadline_)
        return "timeout";
    if (settings_.idle_timeout && calls_.empty() && now - last_activity_ >= *settings_.idle_timeout)
        return "idle_timeout";
    return std::nullopt;
}

uint64_t Sandbox::call(Json request, std::optional<Json> summary, CallHandlers handlers)
{
    const std::string op = request.value("op", "");
    // A call may ask for no more output than serve takes in one line (EpisodeProcess): a
    // larger max_output is lowered to it, and the answer says what was cut (_truncated).
    if ((op == "exec" || op == "shell" || op == "run_code") && request.contains("max_output")
        && request["max_output"].is_number_unsigned()
        && request["max_output"].get<uint64_t>() > EpisodeProcess::max_output_limit)
        request["max_output"] = EpisodeProcess::max_output_limit;
    std::optional<uint64_t> seq;
    if (summary)
        seq = history_.begin(std::move(*summary));
    return send(std::move(request), Call{.handlers = std::move(handlers), .history_seq = seq});
}

uint64_t Sandbox::send(Json request, Call call)
{
    const uint64_t id = next_call_++;
    Json line = Json{{"id", id}};
    for (auto& [key, value] : request.items())
        line[key] = std::move(value);
    last_activity_ = Clock::now();
    call.sent = last_activity_;
    calls_.emplace(id, std::move(call));
    if (!ended_why_.empty()) {
        // A caller that still held the sandbox (an upload between chunks, a fetch's next
        // file): nothing will answer its call, so the sandbox does.
        if (!late_calls_)
            late_calls_.emplace(loop_, [this] { fail_calls(); });
        late_calls_->arm(std::chrono::nanoseconds(1));
        return id;
    }
    episode_->send(to_line(line));
    return id;
}

void Sandbox::forget(uint64_t call)
{
    if (auto it = calls_.find(call); it != calls_.end())
        it->second.handlers = CallHandlers{[](Json&&) {}, [](Json&&) {}};
}

std::optional<uint64_t> Sandbox::history_seq_of(uint64_t call) const
{
    const auto it = calls_.find(call);
    return it == calls_.end() ? std::nullopt : it->second.history_seq;
}

bool Sandbox::cancel(uint64_t seq, std::function<void(Json&& answer)> on_answer)
{
    const auto it = std::find_if(calls_.begin(), calls_.end(),
                                 [seq](const auto& entry) { return entry.second.history_seq == seq; });
    if (it == calls_.end())
        return false;
    send(Json{{"op", "cancel"}, {"call", it->first}},
         Call{.handlers = CallHandlers{[](Json&&) {}, std::move(on_answer)},
              .history_seq = std::nullopt,
              .counts_as_activity = false});
    return true;
}

void Sandbox::on_line(std::string&& line)
{
    Json message = Json::parse(line, nullptr, false);
    line.clear();
    line.shrink_to_fit();
    if (!message.is_object() || !message.contains("id") || !message["id"].is_number_unsigned()) {
        // Dumped only when logged: the line may be hundreds of MiB.
        guest_warn_with(stray_lines_, [&] {
            return fmt::format("sandbox {}: a line about no call of ours: {:.200}", settings_.id,
                               message.dump(-1, ' ', false, Json::error_handler_t::replace));
        });
        return;
    }
    const uint64_t id = message["id"].get<uint64_t>();
    auto it = calls_.find(id);
    if (it == calls_.end()) {
        guest_warn(stray_lines_, "sandbox {}: a line about call {}, which is not running", settings_.id, id);
        return;
    }
    message.erase("id");
    Call& call = it->second;
    if (message.contains("event")) {
        const std::string event = message["event"].is_string() ? message["event"].get<std::string>() : "";
        if (call.history_seq && (event == "stdout" || event == "stderr")) {
            try {
                if (auto bytes = get_bytes(message, "data"))
                    history_.add_output(*call.history_seq, event, *bytes);
            } catch (const CallError&) {
            }
        }
        call.handlers.on_event(std::move(message));
        return;
    }
    last_activity_ = Clock::now();
    Call done = std::move(call);
    calls_.erase(it);
    answered(done, message);
    done.handlers.on_answer(std::move(message));
}

void Sandbox::answered(Call& call, Json& answer)
{
    if (call.history_seq)
        history_.end(*call.history_seq, answer);
    if (call.users && hooks_.on_call_answered)
        hooks_.on_call_answered(answer, Clock::now() - call.sent);
}

void Sandbox::on_exit(int wait_status)
{
    std::string why = !stop_reason_.empty() ? stop_reason_
                      : !broken_reason_.empty() ? broken_reason_
                                               : describe_exit(wait_status);
    if (stop_reason_.empty()) {
        if (const std::string said = last_line(episode_->stderr_tail()); !said.empty())
            why += ": " + said;
    }
    // The episode answers its calls before it ends; what is left, it could not.
    ended_why_ = why;
    fail_calls();
    if (settings_.id.empty())
        spdlog::debug("pool {}: a VM ended: {}", pool_, why);
    else
        spdlog::info("sandbox {} ended: {}", settings_.id, why);
    hooks_.on_exit(*this, why);
}

void Sandbox::fail_calls()
{
    auto calls = std::move(calls_);
    calls_.clear();
    for (auto& [id, call] : calls) {
        Json answer{{"error", {{"code", "vm_died"}, {"message", "the sandbox's VM ended: " + ended_why_}}}};
        answered(call, answer);
        call.handlers.on_answer(std::move(answer));
    }
}

void Sandbox::stop(std::string why)
{
    if (stopping())
        return;
    stop_reason_ = std::move(why);
    stop_requested_ = Clock::now();
    episode_->terminate();
}

void Sandbox::kill_if_overdue(Clock::time_point now)
{
    if (stopping() && now - stop_requested_ >= stop_patience) {
        spdlog::warn("{} {}: the episode did not end within {} s of SIGTERM: killing it",
                     assigned() ? "sandbox" : "pool", assigned() ? settings_.id : pool_, stop_patience.count());
        episode_->kill();
    }
}

void Sandbox::hold_output()
{
    if (output_holds_++ == 0)
        episode_->pause_output();
}

void Sandbox::release_output()
{
    if (output_holds_ > 0 && --output_holds_ == 0)
        episode_->resume_output();
}

Sandbox::Status Sandbox::status() const
{
    const auto expires_wall = assigned_wall_ + std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                                   deadline_ - assigned_at_);
    return Status{stopping(),
                  settings_.warm,
                  restored_,
                  episode_->pid(),
                  settings_.create_time,
                  assigned_wall_,
                  expires_wall,
                  static_cast<size_t>(std::count_if(calls_.begin(), calls_.end(),
                                                    [](const auto& entry) { return entry.second.counts_as_activity; })),
                  history_.total()};
}

} // namespace agentvm
