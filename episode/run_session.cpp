#include "episode/run_session.hpp"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "core/async_writer.hpp"
#include "core/loop_timer.hpp"
#include "episode/agent_vm.hpp"
#include "episode/exit_codes.hpp"
#include "episode/line_reader.hpp"
#include "episode/seconds.hpp"

namespace agentvm {
namespace {

// Host stdin travels inside the one request line, base64-encoded, under the agent's 64 MiB
// line limit.
constexpr size_t max_stdin_bytes = size_t{32} << 20;

// The request says "stream":"only", so every line from the agent is an event carrying at
// most 64 KiB of output (docs/protocol.md) or a response without output: one longer than
// this is a guest gone wrong, and the relay never holds more.
constexpr size_t max_agent_line = size_t{1} << 20;

std::string read_all_stdin()
{
    std::string bytes;
    char buffer[65536];
    for (;;) {
        const ssize_t n = ::read(STDIN_FILENO, buffer, sizeof buffer);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            throw_errno("reading stdin (--stdin)");
        if (n == 0)
            return bytes;
        bytes.append(buffer, static_cast<size_t>(n));
        if (bytes.size() > max_stdin_bytes)
            throw Error(fmt::format("stdin (--stdin) is larger than {} MiB; copy big inputs in with "
                                    "agentvm episode's write_file instead", max_stdin_bytes >> 20));
    }
}

// The one exec request, built and checked before any VM exists.
std::string exec_request(const RunSettings& settings)
{
    Json request{{"id", 1}, {"op", "exec"}, {"stream", "only"}, {"max_output", settings.max_output}};
    request["argv"] = settings.shell.empty() ? settings.argv : std::vector<std::string>{"bash", "-c", settings.shell};
    if (!settings.env.empty()) {
        Json env = Json::object();
        for (const std::string& pair : settings.env) {
            const size_t eq = pair.find('=');
            if (eq == 0 || eq == std::string::npos)
                throw Error(fmt::format("--env '{}' is not NAME=VALUE", pair));
            env[pair.substr(0, eq)] = pair.substr(eq + 1);
        }
        request["env"] = env;
    }
    if (!settings.workdir.empty())
        request["cwd"] = settings.workdir;
    request["timeout"] = settings.timeout_s;
    if (settings.forward_stdin)
        put_bytes(request, "stdin", read_all_stdin());
    std::string line = to_line(request);
    // The agent would say the same, but only after a boot: say it now.
    try {
        parse_request(line.substr(0, line.size() - 1));
    } catch (const RequestError& e) {
        throw Error(e.error.what());
    }
    return line;
}

// How the command ended, from its final response.
struct CommandEnd {
    int exit_code = exit_code::run_failure;
    bool timed_out = false;
    std::string message;  // for stderr, when there is something to say
};

CommandEnd command_end_of(const Json& response, const RunSettings& settings)
{
    CommandEnd end;
    if (const auto error = response.find("error"); error != response.end()) {
        const std::string code = error->value("code", "");
        end.exit_code = code == "not_found" ? exit_code::run_not_found
            : code == "spawn_failed"        ? exit_code::run_cannot_execute
                                            : exit_code::run_failure;
        end.message = error->value("message", "the guest agent reported an error");
        return end;
    }
    std::vector<std::string> notes;
    for (const char* stream : {"stdout", "stderr"})
        if (response.value(std::string(stream) + "_truncated", false))
            notes.push_back(fmt::format("{} was cut at {} bytes (--max-output)", stream, settings.max_output));
    if (response.value("timed_out", false)) {
        end.timed_out = true;
        end.exit_code = exit_code::run_timed_out;
        notes.push_back(fmt::format("the command timed out after {} s and was killed with its process group",
                                    settings.timeout_s));
    } else if (const auto signal = response.find("signal"); signal != response.end() && signal->is_number()) {
        end.exit_code = exit_code::signal_base + signal->get<int>();
        notes.push_back(response.value("oom_killed", false)
                            ? "the command was killed by the guest's OOM killer (--mem)"
                            : fmt::format("the command was killed by signal {}", signal->get<int>()));
    } else {
        end.exit_code = response.value("exit_code", exit_code::run_failure);
    }
    end.message = fmt::format("{}", fmt::join(notes, "; "));
    return end;
}

// Runs the request on the agent and streams its output, on the VM's loop.
class CommandSession {
public:
    CommandSession(AgentVm& agent_vm, const RunSettings& settings, std::string request)
        : agent_vm_(agent_vm), settings_(settings), request_(std::move(request)),
          loop_(agent_vm.vm().event_loop()),
          stdout_(loop_, STDOUT_FILENO, [this](int err) { output_failed("stdout", err); }),
          stderr_(loop_, STDERR_FILENO, [this](int err) { output_failed("stderr", err); }),
          watchdog_(loop_, [this] {
              fail(fmt::format("the guest sent nothing for {} s past the command's timeout",
                               EpisodeRelay::watchdog_grace.count()));
          })
    {
    }

    void start(Fd agent)
    {
        agent_ = std::move(agent);
        agent_out_.emplace(loop_, agent_.get(), [this](int err) {
            fail(fmt::format("the connection to the guest agent failed: {}", std::strerror(err)));
        });
        agent_in_.emplace(loop_, agent_.get(), max_agent_line,
                          LineReader::Handlers{[this](std::string&& line) { on_line(line); },
                                               [this] { fail("the guest agent sent an over-long line"); },
                                               [this](int) { on_agent_end(); }});
        agent_in_->on_partial_line([this](std::string_view) { on_progress(); });
        agent_in_->start();
        agent_out_->write(std::move(request_));
        watchdog_deadline_ = Clock::now()
            + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(settings_.timeout_s))
            + EpisodeRelay::watchdog_grace;
        watchdog_.arm(watchdog_deadline_ - Clock::now());
    }

    void stop_output()
    {
        // From now on the VM is going away: what the agent's connection does is its
        // consequence, not a failure of ours to report.
        stopping_ = true;
        stdout_.stop();
        stderr_.stop();
    }
    void flush_output()
    {
        stdout_.flush_blocking();
        stderr_.flush_blocking();
    }
    const std::optional<CommandEnd>& end() const { return end_; }
    bool broken_pipe() const { return broken_pipe_; }
    const std::string& failure() const { return failure_; }

private:
    using Clock = std::chrono::steady_clock;

    // Bytes from the agent: it is answering (a big response takes a while to cross), so the
    // watchdog's grace starts again (EpisodeRelay::watchdog_grace).
    void on_progress()
    {
        const auto later = Clock::now() + EpisodeRelay::watchdog_grace;
        if (later > watchdog_deadline_) {
            watchdog_deadline_ = later;
            watchdog_.arm(EpisodeRelay::watchdog_grace);
        }
    }

    void on_line(const std::string& line)
    {
        if (end_ || !failure_.empty() || broken_pipe_)
            return;
        on_progress();
        Json message;
        try {
            message = Json::parse(line);
            const auto event = message.find("event");
            if (event == message.end()) {
                end_ = command_end_of(message, settings_);
                agent_vm_.finish("the command finished");
                return;
            }
            const std::optional<std::string> bytes = get_bytes(message, "data");
            if (*event == "stdout" && bytes)
                stdout_.write(*bytes);
            else if (*event == "stderr" && bytes)
                stderr_.write(*bytes);
        } catch (const std::exception& e) {
            fail(fmt::format("the guest agent sent a malformed line: {}", e.what()));
        }
    }

    void on_agent_end()
    {
        if (end_ || !failure_.empty() || stopping_)
            return;
        failure_ = "the guest agent closed the connection before the command finished";
        agent_vm_.fail_unless_vm_ends(failure_);
    }

    void output_failed(const char* stream, int err)
    {
        // A reader that went away (`agentvm run -- yes | head -1`) ends us as it would end
        // any program in a pipeline, quietly, with SIGPIPE's status; other errors are ours.
        if (err == EPIPE) {
            if (!end_ && failure_.empty() && !broken_pipe_) {
                broken_pipe_ = true;
                agent_vm_.finish(fmt::format("{} was closed", stream));
            }
            return;
        }
        fail(fmt::format("writing to {}: {}", stream, std::strerror(err)));
    }

    void fail(const std::string& why)
    {
        if (end_ || !failure_.empty() || stopping_)
            return;
        failure_ = why;
        agent_vm_.fail(why);
    }

    AgentVm& agent_vm_;
    const RunSettings& settings_;
    std::string request_;
    EventLoop& loop_;
    AsyncWriter stdout_;
    AsyncWriter stderr_;
    LoopTimer watchdog_;
    Clock::time_point watchdog_deadline_{};
    Fd agent_;
    std::optional<AsyncWriter> agent_out_;
    std::optional<LineReader> agent_in_;
    std::optional<CommandEnd> end_;
    std::string failure_;
    bool broken_pipe_ = false;
    bool stopping_ = false;  // stop_output() ran
};

} // namespace

int run_one_command(RunSettings& settings)
{
    if (settings.shell.empty() == settings.argv.empty())
        throw Error("give the command after -- (agentvm run -- CMD ARGS...) or with --shell 'STRING', "
                    "not both");
    if (settings.max_output > EpisodeRelay::max_output_limit)
        throw Error(fmt::format("--max-output {} is over the limit of {} bytes", settings.max_output,
                                EpisodeRelay::max_output_limit));
    std::string request = exec_request(settings);
    AgentVm agent_vm(settings.vm, seconds_to_ms(settings.boot_timeout_s));
    CommandSession session(agent_vm, settings, std::move(request));
    const VmResult result = agent_vm.run([&](Fd agent) { session.start(std::move(agent)); },
                                         [&] { session.stop_output(); });
    session.flush_output();

    if (result.outcome == VmOutcome::stopped)
        return exit_code::signal_base + agent_vm.stop_signal();
    if (agent_vm.time_ran_out()) {
        spdlog::error("{}", result.detail);
        return exit_code::run_timed_out;
    }
    if (session.broken_pipe())
        return exit_code::signal_base + SIGPIPE;
    if (result.outcome == VmOutcome::finished && session.end()) {
        const CommandEnd& end = *session.end();
        if (!end.message.empty()) {
            if (end.exit_code >= exit_code::run_timed_out && end.exit_code <= exit_code::run_not_found)
                spdlog::error("{}", end.message);
            else
                spdlog::warn("{}", end.message);
        }
        return end.exit_code;
    }
    if (result.outcome == VmOutcome::panicked)
        spdlog::error("the guest kernel panicked: {}", result.detail);
    else if (result.outcome == VmOutcome::powered_off)
        spdlog::error("the guest powered off before the command finished: {}", result.detail);
    else
        spdlog::error("{}", session.failure().empty() ? result.detail : session.failure());
    return exit_code::run_failure;
}

} // namespace agentvm
